#!/usr/bin/env python3
"""Write the stored seed corpus for tests/fuzz/fuzz_safetensors.c.

Each file is a whole .safetensors image (u64 little-endian header length,
header JSON, data section).  Valid files come first, then one file per class
of malformed input the reader must reject.  Output is deterministic; run
    python3 tests/fuzz/make_safetensors_corpus.py [OUTDIR]
(default: corpus/safetensors next to this script) and commit the result.
"""
import json
import os
import struct
import sys


def image(header, data=b"", hlen=None, pad=True):
    """header: dict (dumped compactly) or str/bytes (used verbatim)."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode("utf-8")
    if pad and isinstance(header, bytes):
        header += b" " * (-len(header) % 8)
    n = len(header) if hlen is None else hlen
    return struct.pack("<Q", n) + header + data


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def corpus():
    c = {}
    # ---- valid ----
    c["valid_empty"] = image({})
    c["valid_f32"] = image({"w": t("F32", [2, 2], 0, 16)}, bytes(range(16)))
    sizes = [("F32", 4), ("F16", 2), ("BF16", 2), ("F8_E4M3", 1), ("F8_E8M0", 1), ("F4", 1),
             ("I8", 1), ("U8", 1), ("I16", 2), ("I32", 4), ("I64", 8), ("BOOL", 1)]
    hdr, off = {}, 0
    for i, (dt, sz) in enumerate(sizes):
        hdr["t%02d.%s" % (i, dt.lower())] = t(dt, [3], off, off + 3 * sz)
        off += 3 * sz
    c["valid_all_dtypes"] = image(hdr, bytes(off))
    c["valid_metadata"] = image({"__metadata__": {"format": "pt", "k": ""},
                                 "b": t("BF16", [1, 4], 0, 8)}, bytes(8))
    c["valid_scalar_and_empty"] = image({"s": t("I64", [], 0, 8), "e": t("U8", [0, 3], 8, 8),
                                         "e2": t("F32", [5, 0], 8, 8)}, bytes(8))
    c["valid_gap_and_tail"] = image({"a": t("U8", [2], 0, 2), "b": t("U8", [2], 6, 8)}, bytes(12))
    c["valid_eight_dims"] = image({"d": t("U8", [1, 1, 1, 1, 1, 1, 2, 2], 0, 4)}, bytes(4))
    ds = {"__metadata__": {"format": "pt"}}
    off = 0
    for e in range(2):
        p = "model.layers.3.ffn.experts.%d." % e
        ds[p + "w1.weight"] = t("I8", [4, 8], off, off + 32); off += 32
        ds[p + "w1.scale"] = t("F8_E8M0", [4, 1], off, off + 4); off += 4
        ds[p + "w2.weight"] = t("F4", [8, 2], off, off + 16); off += 16
    ds["model.embed.weight"] = t("F8_E4M3", [4, 4], off, off + 16); off += 16
    c["valid_deepseek_like"] = image(ds, bytes(off))
    c["valid_unpadded"] = image('{"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}', b"abc", pad=False)
    # ---- framing ----
    c["bad_empty_file"] = b""
    c["bad_short_file"] = b"\x02\x00\x00"
    c["bad_header_past_end"] = image({"w": t("U8", [1], 0, 1)}, b"x", hlen=4096)
    c["bad_header_len_huge"] = image({}, hlen=1 << 63)
    c["bad_header_len_over_limit"] = image({}, hlen=100 * 1024 * 1024 + 1)
    c["bad_header_len_short"] = image({"w": t("U8", [1], 0, 1)}, b"x", hlen=6)
    # ---- JSON ----
    c["bad_json_syntax"] = image('{"w": {"dtype": "F32", ')
    c["bad_json_array"] = image("[1, 2, 3]")
    c["bad_json_trailing"] = image("{} {}")
    c["bad_json_nul_in_key"] = image('{"w\\u0000x": {"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"x")
    c["bad_json_invalid_utf8"] = image(b'{"w\xff": {"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"x")
    c["bad_json_deep_nesting"] = image('{"__metadata__":' + "[" * 5000 + "]" * 5000 + "}")
    c["bad_json_big_integer"] = image('{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,99999999999999999999]}}')
    c["bad_duplicate_names"] = image('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                     '"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"xy")
    # ---- entries ----
    c["bad_entry_not_object"] = image({"w": [1, 2]})
    c["bad_missing_dtype"] = image({"w": {"shape": [1], "data_offsets": [0, 1]}}, b"x")
    c["bad_dtype_unknown"] = image({"w": t("Q7", [1], 0, 1)}, b"x")
    c["bad_dtype_not_string"] = image({"w": {"dtype": 5, "shape": [1], "data_offsets": [0, 1]}}, b"x")
    c["bad_shape_not_array"] = image({"w": {"dtype": "U8", "shape": {"0": 1}, "data_offsets": [0, 1]}}, b"x")
    c["bad_shape_float"] = image({"w": t("U8", [1.0], 0, 1)}, b"x")
    c["bad_shape_negative"] = image({"w": t("U8", [-1], 0, 1)}, b"x")
    c["bad_shape_too_many_dims"] = image({"w": t("U8", [1] * 9, 0, 1)}, b"x")
    c["bad_shape_overflow"] = image({"w": t("F32", [1 << 32, 1 << 32, 1 << 32], 0, 4)}, bytes(4))
    c["bad_bytes_mismatch"] = image({"w": t("F32", [3], 0, 8)}, bytes(8))
    c["bad_offsets_past_end"] = image({"w": t("U8", [8], 0, 8)}, bytes(4))
    c["bad_offsets_begin_gt_end"] = image({"w": t("U8", [0], 8, 4)}, bytes(8))
    c["bad_offsets_negative"] = image({"w": t("U8", [4], -4, 0)}, bytes(8))
    c["bad_offsets_wrong_arity"] = image({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}}, b"x")
    c["bad_overlap"] = image({"a": t("U8", [8], 0, 8), "b": t("U8", [4], 6, 10)}, bytes(12))
    c["bad_metadata_not_object"] = image({"__metadata__": "pt"})
    c["bad_metadata_non_string"] = image({"__metadata__": {"n": 1, "o": {"x": [None, True]}}})
    c["bad_nested_garbage"] = image({"w": {"dtype": {"a": [[{}], None]}, "shape": [[1]],
                                           "data_offsets": [[0], {"e": 1}]}})
    return c


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                             "corpus", "safetensors")
    os.makedirs(out, exist_ok=True)
    for name, data in sorted(corpus().items()):
        with open(os.path.join(out, name + ".safetensors"), "wb") as f:
            f.write(data)
    print("wrote %d files to %s" % (len(corpus()), out))


if __name__ == "__main__":
    main()

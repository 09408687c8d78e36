#!/usr/bin/env python3
"""Write the stored seed corpus for tests/fuzz/fuzz_tokenizer.c.

Each file is raw input bytes for the encoder: texts of every kind the
tokenizer meets (prose, code, CJK, kana, Korean, emoji sequences, numbers,
whitespace runs, special-token text, DSML) and byte strings that are not
valid UTF-8.  Output is deterministic; run
    python3 tests/fuzz/make_tokenizer_corpus.py [OUTDIR]
(default: corpus/tokenizer next to this script) and commit the result.
"""
import os
import sys

SEEDS = {
    "prose": "The quick brown fox jumps over the lazy dog. It's 9:30 -- isn't it? I'll see you'd've known.",
    "code_c": 'int main(void)\n{\n\tprintf("%d\\n", a[i++] << 2);\n\treturn 0;\n}\n',
    "code_py": "def f(x):\n    return {k: v for k, v in x.items() if v is not None}  # comment\r\n",
    "chinese": "大型语言模型的推理服务需要高效的调度与缓存。毕老师！（测试）",
    "japanese": "こんにちは、世界！カタカナとひらがな。ｶﾀｶﾅ ゟ゠ヿ",
    "korean": "안녕하세요, 세계! 한국어 텍스트.",
    "emoji": "👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵 1️⃣ 👍🏽 🏴󠁧󠁢󠁳󠁣󠁴󠁿",
    "numbers": "1 12 123 1234 12345678901234567890 3.14159 -2.5e-10 ٣٤٥ １２３ ²³ ½ Ⅻ",
    "whitespace": "a  b\t\tc\n\n\nd\r\n\r\ne \u00a0 \u3000 \u2028\u2029\x0b\x0c\x85 f   \n  ",
    "mixed_scripts": "Привет мир Ελληνικά مرحبا שלום नमस्ते e\u0301\u0308 ﬁ 𝔘𝔫𝔦",
    "punct": "!!!???...;;;:::\"\"''```~~~@@@###$$$%%%^^^&&&***((()))[[[]]]{{{}}}<<<>>>|||\\\\\\///---___+++===",
    "special": "<｜begin▁of▁sentence｜>sys<｜User｜>hi<｜Assistant｜><think>x</think>y<｜end▁of▁sentence｜><｜User",
    "dsml": "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">v</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
    "new_unicode": "\u1c89\ua7cb\U000105c0\U00010d40\u0897\u2427\U0001fae9 \U000f0000\ue000\U0010ffff",
    "long_space_run": " " * 600 + "x" + "\n" * 300,
    "long_word": "a" * 700 + "ab" * 200,
    "long_cjk": "的" * 400,
}
BYTES = {
    "bad_lone_continuation": b"a\x80b\xbf",
    "bad_truncated": b"\xe2\x82 x \xf0\x9f\x98",
    "bad_surrogate": b"\xed\xa0\x80\xed\xbf\xbf",
    "bad_overlong": b"\xc0\xaf\xe0\x80\xaf\xf0\x80\x80\xaf",
    "bad_out_of_range": b"\xf4\x90\x80\x80\xf5\xff\xfe",
    "nul_bytes": b"a\x00b\x00\x00<think>\x00",
    "empty": b"",
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                "corpus", "tokenizer")
    os.makedirs(out, exist_ok=True)
    files = {k: v.encode("utf-8") for k, v in SEEDS.items()}
    files.update(BYTES)
    for name, data in sorted(files.items()):
        with open(os.path.join(out, name + ".txt"), "wb") as f:
            f.write(data)
    print(f"make_tokenizer_corpus: {len(files)} files in {out}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Golden logits for duet's numerical test, from transformers' DeepseekV4ForCausalLM.

Loads a duet fixture checkpoint (official DeepSeek-V4 tensor names; BF16 weights, or FP8 weights
with ue8m0 128x128 block scales and packed FP4 experts, dequantized exactly to float32) into
transformers' DeepseekV4ForCausalLM in float32, runs each prompt as one forward pass and
writes, per position, the argmax over the whole vocabulary and the logits at a fixed set of
columns (the golden file stays small).

--cache-rounding bf16 makes the reference store what duet's bf16 cache stores: the
sliding-window K=V vectors, compressed entries and indexer keys are rounded to bf16 right
after their RoPE, exactly where duet encodes them into its pools.  Without it the reference
is pure float32; both are written so the test can report the gap.

Usage: golden_logits.py --model DIR --out FILE.json [--prompts 5,64,333] [--seed 1]
"""
import argparse
import json
import sys

try:
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mdl
except ImportError as e:  # pragma: no cover
    print(f"golden_logits: SKIP: needs torch, transformers>=5.8, safetensors ({e})", file=sys.stderr)
    sys.exit(77)

RATIO_TO_TYPE = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


def official_to_hf(name):
    """Map one official checkpoint name to transformers' parameter name (None: skip)."""
    if name.startswith("mtp."):
        return None
    top = {"embed.weight": "model.embed_tokens.weight", "head.weight": "lm_head.weight",
           "norm.weight": "model.norm.weight", "hc_head_fn": "model.hc_head.hc_fn",
           "hc_head_base": "model.hc_head.hc_base", "hc_head_scale": "model.hc_head.hc_scale"}
    if name in top:
        return top[name]
    parts = name.split(".")
    assert parts[0] == "layers", name
    pre = f"model.layers.{parts[1]}."
    rest = ".".join(parts[2:])
    simple = {
        "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
        "hc_attn_fn": "attn_hc.fn", "hc_attn_base": "attn_hc.base", "hc_attn_scale": "attn_hc.scale",
        "hc_ffn_fn": "ffn_hc.fn", "hc_ffn_base": "ffn_hc.base", "hc_ffn_scale": "ffn_hc.scale",
        "attn.attn_sink": "self_attn.sinks", "attn.wq_a.weight": "self_attn.q_a_proj.weight",
        "attn.q_norm.weight": "self_attn.q_a_norm.weight", "attn.wq_b.weight": "self_attn.q_b_proj.weight",
        "attn.wkv.weight": "self_attn.kv_proj.weight", "attn.kv_norm.weight": "self_attn.kv_norm.weight",
        "attn.wo_a.weight": "self_attn.o_a_proj.weight", "attn.wo_b.weight": "self_attn.o_b_proj.weight",
        "attn.compressor.wkv.weight": "self_attn.compressor.kv_proj.weight",
        "attn.compressor.wgate.weight": "self_attn.compressor.gate_proj.weight",
        "attn.compressor.ape": "self_attn.compressor.position_bias",
        "attn.compressor.norm.weight": "self_attn.compressor.kv_norm.weight",
        "attn.indexer.wq_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
        "attn.indexer.weights_proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
        "attn.indexer.compressor.wkv.weight": "self_attn.compressor.indexer.kv_proj.weight",
        "attn.indexer.compressor.wgate.weight": "self_attn.compressor.indexer.gate_proj.weight",
        "attn.indexer.compressor.ape": "self_attn.compressor.indexer.position_bias",
        "attn.indexer.compressor.norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
        "ffn.gate.weight": "mlp.gate.weight", "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
        "ffn.gate.tid2eid": "mlp.gate.tid2eid",
        "ffn.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
        "ffn.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
        "ffn.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
    }
    if rest in simple:
        return pre + simple[rest]
    if rest.startswith("ffn.experts."):
        return "EXPERT:" + pre + rest  # fused below
    raise KeyError(f"no mapping for {name}")


FP4_TABLE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def e8m0_to_f32(s):
    """ue8m0 scale bytes -> 2^(e-127) (exact in float32)."""
    return torch.exp2(s.view(torch.uint8).to(torch.float64) - 127).to(torch.float32)


def dequantize(raw):
    """Exact float32 weights from quantized ones, each "<base>.weight" with its "<base>.scale":
    F8_E4M3 [out, in] with F8_E8M0 [ceil(out/128), ceil(in/128)] block scales, or packed fp4
    (I8 [out, in/2], low nibble = even column, e2m1 codes) with F8_E8M0 [out, in/32] scales."""
    out = {}
    for k, v in raw.items():
        if k.endswith(".scale"):
            if k[: -len(".scale")] + ".weight" not in raw:
                sys.exit(f"golden_logits: {k}: scale without a weight")
            continue
        s = raw.get(k[: -len(".weight")] + ".scale") if k.endswith(".weight") else None
        if v.dtype == torch.float8_e4m3fn:
            if s is None:
                sys.exit(f"golden_logits: {k}: fp8 weight without a .scale")
            rows, cols = v.shape
            sc = e8m0_to_f32(s).repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
            out[k] = v.to(torch.float32) * sc
        elif v.dtype in (torch.int8, torch.uint8) and s is not None:
            b = v.view(torch.uint8).to(torch.long)
            lut = torch.tensor(FP4_TABLE, dtype=torch.float32)
            w = torch.stack([lut[b & 0xF], lut[b >> 4]], dim=-1).flatten(1)  # [out, in]
            out[k] = w * e8m0_to_f32(s).repeat_interleave(32, 1)
        elif s is not None:
            sys.exit(f"golden_logits: {k}: unexpected .scale for a {v.dtype} weight")
        else:
            out[k] = v
    return out


def load_state(model_dir, cfg):
    index = json.load(open(f"{model_dir}/model.safetensors.index.json"))
    shards = sorted(set(index["weight_map"].values()))
    raw = {}
    for s in shards:
        raw.update(load_file(f"{model_dir}/{s}"))
    raw = dequantize(raw)
    state, experts = {}, {}
    for k, v in raw.items():
        hf = official_to_hf(k)
        if hf is None:
            continue
        if hf.startswith("EXPERT:"):
            _, rest = hf.split(":", 1)
            layer_pre, tail = rest.split("ffn.experts.")
            e, w = tail.split(".")[0:2]
            experts.setdefault(layer_pre, {}).setdefault(int(e), {})[w] = v
            continue
        state[hf] = v.to(torch.long) if k.endswith("tid2eid") else v.to(torch.float32)
    for layer_pre, ex in experts.items():
        n = len(ex)
        state[layer_pre + "mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([ex[e]["w1"], ex[e]["w3"]], dim=0) for e in range(n)]).to(torch.float32)
        state[layer_pre + "mlp.experts.down_proj"] = torch.stack([ex[e]["w2"] for e in range(n)]).to(torch.float32)
    return state


def make_config(model_dir):
    raw = json.load(open(f"{model_dir}/config.json"))
    n = raw["num_hidden_layers"]
    kw = {k: v for k, v in raw.items() if k not in ("quantization_config", "architectures", "model_type",
                                                      "torch_dtype", "transformers_version", "expert_dtype")}
    cfg = transformers.DeepseekV4Config(**kw)
    want = [RATIO_TO_TYPE[r] for r in raw["compress_ratios"][:n]]
    if list(cfg.layer_types) != want:
        cfg.layer_types = want
    mlp = ["hash_moe"] * raw.get("num_hash_layers", 0) + ["moe"] * (n - raw.get("num_hash_layers", 0))
    if list(cfg.mlp_layer_types) != mlp:
        cfg.mlp_layer_types = mlp
    return cfg, raw


def install_cache_rounding():
    orig = mdl.apply_rotary_pos_emb

    def rounded(x, cos, sin, unsqueeze_dim=1):
        out = orig(x, cos, sin, unsqueeze_dim)
        # K=V vectors, compressed entries and indexer keys are the single-head [B, 1, S, D] calls;
        # queries have one entry per head there and the output's inverse rope is [B, S, H, D], S > 1.
        if out.dim() == 4 and out.shape[1] == 1:
            out = out.to(torch.bfloat16).to(out.dtype)
        return out

    mdl.apply_rotary_pos_emb = rounded


def install_stable_topk():
    """Ties broken toward the lower index, as duet's top-k does.

    The lightning indexer's ReLU makes exact ties common (an entry that every head scores
    negatively scores exactly 0); torch leaves the order of tied elements unspecified."""

    def topk(self, k, dim=-1, largest=True, sorted=True):
        vals, idx = torch.sort(self, dim=dim, descending=largest, stable=True)
        return torch.return_types.topk((vals.narrow(dim, 0, k), idx.narrow(dim, 0, k)))

    torch.Tensor.topk = topk


def prompt_ids(n, seed, vocab):
    g = torch.Generator().manual_seed(seed * 1000 + n)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", default="5,64,333")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--columns", type=int, default=64)
    a = ap.parse_args()
    torch.manual_seed(0)
    install_stable_topk()
    cfg, raw = make_config(a.model)
    state = load_state(a.model, cfg)
    results = {}
    V = raw["vocab_size"]
    g = torch.Generator().manual_seed(12345)
    cols = sorted(torch.randperm(V, generator=g)[: a.columns].tolist())
    prompts = [prompt_ids(int(n), a.seed, V) for n in a.prompts.split(",")]
    for mode in ("f32", "bf16"):
        if mode == "bf16":
            install_cache_rounding()
        model = transformers.DeepseekV4ForCausalLM(cfg).to(torch.float32).eval()
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if not m.endswith("inv_freq")]
        if missing or unexpected:
            sys.exit(f"golden_logits: state mismatch: missing {missing[:8]} unexpected {unexpected[:8]}")
        out = []
        with torch.no_grad():
            for ids in prompts:
                assert len(ids) > 1
                logits = model(torch.tensor([ids]), use_cache=True).logits[0].float()
                top2 = logits.topk(2, dim=-1)
                out.append({
                    "argmax": top2.indices[:, 0].tolist(),
                    "gap": (top2.values[:, 0] - top2.values[:, 1]).tolist(),
                    "logits": logits[:, cols].flatten().tolist(),
                    "argmax_logit": top2.values[:, 0].tolist(),
                })
        results[mode] = out
    doc = {
        "generator": "tests/reference/golden_logits.py",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "model_config": raw, "columns": cols, "prompts": prompts, "reference": results,
    }
    with open(a.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    print(f"golden_logits: wrote {a.out}: {len(prompts)} prompts, {len(cols)} columns", file=sys.stderr)


if __name__ == "__main__":
    main()

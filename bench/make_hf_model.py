#!/usr/bin/python3
"""A Hugging Face folder of random weights with a real model's config.json, for bench_load_model
(load time, memory, forward, generate and a training step at real sizes):

    /usr/bin/python3 bench/make_hf_model.py smollm2-135m OUT    (LlamaForCausalLM, 135 M parameters)
    /usr/bin/python3 bench/make_hf_model.py qwen2.5-0.5b OUT    (Qwen2ForCausalLM, 494 M)
    /usr/bin/python3 bench/make_hf_model.py pythia-160m OUT     (GPTNeoXForCausalLM, 162 M)

The configs are the published config.json files' fields; the weights are N(0, 0.02) (norm weights
1, biases 0) in F32, drawn with numpy from a fixed seed, under each family's tensor names. Needs
numpy only (Debian's python3-numpy).
"""

import json
import os
import struct
import sys

import numpy as np

CONFIGS = {
    "smollm2-135m": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0,
        "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.041666666666666664,
        "intermediate_size": 1536, "is_llama_config": True, "max_position_embeddings": 8192, "model_type": "llama",
        "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3, "pretraining_tp": 1,
        "rms_norm_eps": 1e-05, "rope_interleaved": False, "rope_scaling": None, "rope_theta": 100000,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True,
        "vocab_size": 49152},
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
        "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
        "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False, "use_sliding_window": False,
        "vocab_size": 151936},
    "pythia-160m": {
        "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu",
        "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05,
        "max_position_embeddings": 2048, "model_type": "gpt_neox", "num_attention_heads": 12,
        "num_hidden_layers": 12, "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False,
        "torch_dtype": "float16", "transformers_version": "4.24.0", "use_cache": True, "use_parallel_residual": True,
        "vocab_size": 50304},
}


def tensors(c):
    """(name, shape, kind) in the order save_pretrained writes them; kind: weight, norm or bias."""
    V, C, F, L = c["vocab_size"], c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    H = c["num_attention_heads"]
    D = c.get("head_dim", C // H)
    KV = c.get("num_key_value_heads", H)
    out = []
    if c["model_type"] == "gpt_neox":
        out.append(("gpt_neox.embed_in.weight", (V, C), "weight"))
        for n in range(L):
            p = "gpt_neox.layers.%d." % n
            for ln in ("input_layernorm", "post_attention_layernorm"):
                out += [(p + ln + ".weight", (C,), "norm"), (p + ln + ".bias", (C,), "bias")]
            for name, o, i in (("attention.query_key_value", 3 * C, C), ("attention.dense", C, C),
                               ("mlp.dense_h_to_4h", F, C), ("mlp.dense_4h_to_h", C, F)):
                out += [(p + name + ".weight", (o, i), "weight"), (p + name + ".bias", (o,), "bias")]
        out += [("gpt_neox.final_layer_norm.weight", (C,), "norm"), ("gpt_neox.final_layer_norm.bias", (C,), "bias"),
                ("embed_out.weight", (V, C), "weight")]
        return out
    qkv_bias = c["model_type"] == "qwen2"
    out.append(("model.embed_tokens.weight", (V, C), "weight"))
    for n in range(L):
        p = "model.layers.%d." % n
        out.append((p + "input_layernorm.weight", (C,), "norm"))
        for name, o, i in (("q", H * D, C), ("k", KV * D, C), ("v", KV * D, C), ("o", C, H * D)):
            out.append((p + "self_attn.%s_proj.weight" % name, (o, i), "weight"))
            if qkv_bias and name != "o":
                out.append((p + "self_attn.%s_proj.bias" % name, (o,), "bias"))
        out.append((p + "post_attention_layernorm.weight", (C,), "norm"))
        for name, o, i in (("gate", F, C), ("up", F, C), ("down", C, F)):
            out.append((p + "mlp.%s_proj.weight" % name, (o, i), "weight"))
    out.append(("model.norm.weight", (C,), "norm"))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, C), "weight"))
    return out


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in CONFIGS:
        sys.exit("usage: make_hf_model.py {%s} OUT" % ",".join(CONFIGS))
    c, out = CONFIGS[sys.argv[1]], sys.argv[2]
    os.makedirs(out, exist_ok=False)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    rng = np.random.default_rng(2026)
    header, offset, listed = {"__metadata__": {"format": "pt"}}, 0, tensors(c)
    for name, shape, _ in listed:
        size = 4 * int(np.prod(shape))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape, kind in listed:
            if kind == "weight":
                a = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
            else:
                a = np.full(shape, 1.0 if kind == "norm" else 0.0, dtype=np.float32)
            f.write(a.astype("<f4").tobytes())
    print("%s: %d tensors, %.0f MiB" % (out, len(listed), offset / 1048576))


if __name__ == "__main__":
    main()

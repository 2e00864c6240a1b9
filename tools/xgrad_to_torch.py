#!/usr/bin/python3
"""Runs an xgrad LanguageModel checkpoint in PyTorch.

Reads the safetensors file that nn::save_checkpoint writes (with numpy and json only; the
optimizer's tensors are skipped), builds the equivalent torch.nn.Module and loads the weights
into it. Checkpoints of format 2 (metadata "xgrad.checkpoint" = "2") store the model options as
JSON under "xgrad.model_options": the architecture comes from them, and the arguments num_heads,
activation and layer_norm_eps are optional checks (one that contradicts the file is an error
naming the field). Older files (format 1) store no options: the architecture then comes from the
tensors (vocabulary, d_model, layers and FFN width from their shapes; learned positions iff
"pos_emb.weight" exists, otherwise the sinusoidal table; Pre-Norm iff "final_norm.*" exists) and
the arguments: num_heads (required), the FFN activation ("gelu", "gelu_tanh" or "relu"; default
"gelu") and layer_norm_eps (1e-5).

    from xgrad_to_torch import load_xgrad_lm
    model = load_xgrad_lm("model.safetensors")          # format 2; num_heads=4 for format 1
    logits = model(torch.tensor([[1, 2, 3]]))          # (B, T, V)

    /usr/bin/python3 tools/xgrad_to_torch.py model.safetensors [--heads 4] --ids 1,2,3 [--argmax]

tests/fixtures/make_export_fixtures.py and tests/test_torch_export.cpp check it against xgrad.
Shapes: B batch, T length, C d_model, H heads, D = C / H, V vocabulary, F FFN width.
"""

import argparse
import json
import math
import re
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}


def read_safetensors(path):
    """({name: float32 array} of the model's tensors, model options or None) of an xgrad checkpoint."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    if len(raw) < 8 or n > len(raw) - 8:
        raise ValueError("%s is not a safetensors file (header length %d, file size %d)" % (path, n, len(raw)))
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    meta = header.get("__metadata__", {})
    fmt = meta.get("xgrad.checkpoint")
    if fmt not in (None, "2"):
        raise ValueError("%s has checkpoint format %r; this tool reads formats 1 and 2" % (path, fmt))
    optimizer = "optimizer." if fmt is None else "optimizer:"  # format 1 / format 2
    options = json.loads(meta["xgrad.model_options"]) if fmt == "2" and "xgrad.model_options" in meta else None
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or name.startswith(optimizer):
            continue
        if info["dtype"] != "F32":
            raise ValueError("%s: tensor %s has dtype %s, expected F32" % (path, name, info["dtype"]))
        begin, end = info["data_offsets"]
        name = re.sub(r"^(blocks\.\d+\.)ffn_norm\.", r"\1ffn.norm.", name)  # checkpoints before the rename
        out[name] = np.frombuffer(data[begin:end], dtype="<f4").reshape(info["shape"]).copy()
    return out, options


class Attention(nn.Module):
    """softmax(Q_h K_h^T / sqrt(D) + causal mask) V_h, heads concatenated, then w_o."""

    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(c, c) for _ in range(4))

    def forward(self, x):
        b, t, c = x.shape
        split = lambda y: y.reshape(b, t, self.heads, c // self.heads).transpose(1, 2)  # (B, H, T, D)
        q, k, v = split(self.w_q(x)), split(self.w_k(x)), split(self.w_v(x))
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(c // self.heads))
        blocked = torch.ones(t, t, dtype=torch.bool).triu(1)
        weights = scores.masked_fill(blocked, float("-inf")).softmax(-1)
        return self.w_o((weights @ v).transpose(1, 2).reshape(b, t, c))


class FeedForward(nn.Module):
    def __init__(self, c, f, activation):
        super().__init__()
        self.linear1, self.linear2, self.act = nn.Linear(c, f), nn.Linear(f, c), ACTIVATIONS[activation]

    def forward(self, x):
        return self.linear2(self.act(self.linear1(x)))


class Block(nn.Module):
    """Pre-Norm x + f(norm(x)), Post-Norm norm(x + f(x)), for f = attn, then ffn; each owns its norm."""

    def __init__(self, c, heads, f, activation, pre, eps):
        super().__init__()
        self.pre, self.attn, self.ffn = pre, Attention(c, heads), FeedForward(c, f, activation)
        self.attn.norm, self.ffn.norm = nn.LayerNorm(c, eps=eps), nn.LayerNorm(c, eps=eps)

    def forward(self, x):
        for sub in (self.attn, self.ffn):
            x = x + sub(sub.norm(x)) if self.pre else sub.norm(x + sub(x))
        return x


class LanguageModel(nn.Module):
    def __init__(self, vocab, c, heads, layers, f, max_len, learned, activation, pre, eps):
        super().__init__()
        if c % heads:
            raise ValueError("d_model %d is not divisible by num_heads %d" % (c, heads))
        self.max_len = max_len  # None: unknown (a format-1 file with sinusoidal positions)
        self.tok_emb = nn.Embedding(vocab, c)
        if learned:
            self.pos_emb = nn.Embedding(max_len, c)  # the same parameter name, "pos_emb.weight"
        self.blocks = nn.ModuleList(Block(c, heads, f, activation, pre, eps) for _ in range(layers))
        self.final_norm = nn.LayerNorm(c, eps=eps) if pre else None
        self.head = nn.Linear(c, vocab)

    def positions(self, t, c):
        if hasattr(self, "pos_emb"):
            return self.pos_emb.weight[:t]
        # PE[t, j] = sin(t / 10000^((j - j % 2) / C)) for even j, cos for odd j; in double, as xgrad
        j = np.arange(c)
        angle = np.arange(t)[:, None] * np.power(10000.0, -(j - j % 2) / c)[None, :]
        return torch.from_numpy(np.where(j % 2 == 0, np.sin(angle), np.cos(angle)).astype(np.float32))

    def forward(self, ids):
        """ids (B, T) int64 -> logits (B, T, V)."""
        if self.max_len is not None and ids.shape[1] > self.max_len:
            raise ValueError("sequence length %d exceeds max_len %d" % (ids.shape[1], self.max_len))
        if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < self.tok_emb.num_embeddings:
            raise ValueError("token ids must lie in [0, %d)" % self.tok_emb.num_embeddings)
        h = self.tok_emb(ids) + self.positions(ids.shape[1], self.tok_emb.embedding_dim)
        for block in self.blocks:
            h = block(h)
        if self.final_norm is not None:
            h = self.final_norm(h)
        return self.head(h)


def check_asked(options, num_heads, activation, layer_norm_eps):
    """Raises naming every argument that contradicts the stored options (eps compared as float32)."""
    asked = [("num_heads", num_heads, num_heads is not None and num_heads != options["num_heads"]),
             ("activation", activation, activation is not None and activation != options["activation"]),
             ("layer_norm_eps", layer_norm_eps,
              layer_norm_eps is not None and np.float32(layer_norm_eps) != np.float32(options.get("norm_eps", options.get("layer_norm_eps"))))]
    wrong = ["%s %s in the file, %s asked" % (name, options[name], value) for name, value, differs in asked if differs]
    if wrong:
        raise ValueError("the stored model options contradict the ones asked for: " + "; ".join(wrong))


def load_xgrad_lm(path, num_heads=None, activation=None, layer_norm_eps=None):
    """The xgrad LanguageModel saved at path as a torch.nn.Module in eval mode."""
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError("activation %r is not one of %s" % (activation, ", ".join(ACTIVATIONS)))
    w, options = read_safetensors(path)
    if options is not None:
        check_asked(options, num_heads, activation, layer_norm_eps)
        o = options
        model = LanguageModel(o["vocab_size"], o["d_model"], o["num_heads"], o["num_layers"], o["d_ff"], o["max_len"],
                              o["positional"] == "learned", o["activation"], o["norm"] == "pre", o.get("norm_eps", o.get("layer_norm_eps")))
    else:
        if num_heads is None:
            raise ValueError("%s stores no model options (a checkpoint from before format 2): give num_heads" % path)
        layers = len({int(m.group(1)) for m in map(re.compile(r"blocks\.(\d+)\.").match, w) if m})
        if "tok_emb.weight" not in w or layers == 0:
            raise ValueError("%s is not an xgrad LanguageModel checkpoint (no tok_emb.weight or blocks.N.*)" % path)
        vocab, c = w["tok_emb.weight"].shape
        f = w["blocks.0.ffn.linear1.weight"].shape[0]
        learned = "pos_emb.weight" in w
        max_len = w["pos_emb.weight"].shape[0] if learned else None
        model = LanguageModel(vocab, c, num_heads, layers, f, max_len, learned, activation or "gelu",
                              "final_norm.weight" in w, 1e-5 if layer_norm_eps is None else layer_norm_eps)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in w.items()})  # strict: names and shapes must match
    return model.eval()


def token_ids(text):
    return [int(i) for i in text.split(",")]


def main():
    p = argparse.ArgumentParser(description="Run an xgrad LanguageModel checkpoint in PyTorch.")
    p.add_argument("checkpoint")
    p.add_argument("--heads", type=int, help="num_heads: required for a file without stored options, else checked")
    p.add_argument("--activation", choices=sorted(ACTIVATIONS), help="default: the file's, or gelu")
    p.add_argument("--eps", type=float, help="LayerNorm eps; default: the file's, or 1e-5")
    p.add_argument("--ids", required=True, type=token_ids, help="comma-separated token ids, e.g. 1,2,3")
    p.add_argument("--argmax", action="store_true", help="print the most likely next token per position")
    a = p.parse_args()
    try:
        model = load_xgrad_lm(a.checkpoint, a.heads, a.activation, a.eps)
        with torch.no_grad():
            logits = model(torch.tensor([a.ids]))[0]  # (T, V)
    except (OSError, ValueError, KeyError, IndexError, RuntimeError) as e:
        sys.exit("xgrad_to_torch: %s" % e)
    for row in logits:
        print(int(row.argmax()) if a.argmax else " ".join("%.6g" % v for v in row.tolist()))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Runs an xgrad LanguageModel checkpoint in PyTorch, and writes a Llama-style one as a Hugging Face
LlamaForCausalLM directory.

Reads the safetensors file that weights::save_checkpoint writes (with numpy and json only; the
optimizer's tensors are skipped), builds the equivalent torch.nn.Module, with xgrad's parameter
names, and loads the weights into it strictly. Checkpoints of format 2 (metadata
"xgrad.checkpoint" = "2") store the model options as JSON under "xgrad.model_options": the
architecture comes from them alone (a field that files written before it existed lack takes its
classic value, and their "layer_norm_eps" is norm_eps), and the arguments num_heads, activation
and norm_eps are optional checks (one that contradicts the file is an error naming the field).
Older files (format 1) store no options: the architecture then comes from the tensors
(vocabulary, d_model, layers and FFN width from their shapes; learned positions iff
"pos_emb.weight" exists, otherwise the sinusoidal table; Pre-Norm iff "final_norm.*" exists;
LayerNorms with biases, every projection with a bias, an untied head) and the arguments:
num_heads (required), the FFN activation ("gelu", "gelu_tanh" or "relu"; default "gelu") and
norm_eps (1e-5).

    from xgrad_to_torch import load_xgrad_lm
    model = load_xgrad_lm("model.safetensors")          # format 2; num_heads=4 for format 1
    logits = model(torch.tensor([[1, 2, 3]]))          # (B, T, V)
    logits, attentions = model(ids, key_padding_mask, return_attentions=True)

    /usr/bin/python3 tools/xgrad_to_torch.py model.safetensors [--heads 4] --ids 1,2,3 [--argmax]
    /usr/bin/python3 tools/xgrad_to_torch.py model.safetensors --hf-out llama_dir

--hf-out writes model.safetensors under LlamaForCausalLM's names and config.json for a model
that the Llama layout expresses (RMSNorm with weights, Pre-Norm, full rotary positions, SwiGLU,
no biases, no QK-norm; any num_kv_heads; tied or untied head) and refuses any other, naming each
field that stands in the way.

tests/fixtures/make_export_fixtures.py with tests/test_torch_export.cpp, and
tests/fixtures/make_arch_fixtures.py with tests/test_arch_agreement.cpp, check it against xgrad.
Shapes: B batch, T length, C d_model, H heads, KV key/value heads, D head_dim (C / H unless set), V vocabulary,
F FFN width.
"""

import argparse
import json
import math
import os
import re
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ACTIVATIONS = {  # act, and whether the feed-forward is gated: linear2(act(gate(x)) * linear1(x))
    "gelu": (F.gelu, False),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), False),
    "relu": (F.relu, False),
    "swiglu": (F.silu, True),
    "geglu": (F.gelu, True),
    "geglu_tanh": (lambda x: F.gelu(x, approximate="tanh"), True),
}
COUNTS = ("vocab_size", "d_model", "num_heads", "num_layers", "d_ff", "max_len")
CHOICES = {"norm": ("pre", "post", "sandwich"), "norm_kind": ("layer_norm", "rms_norm"), "activation": tuple(ACTIVATIONS),
           "positional": ("learned", "sinusoidal", "none", "rotary"), "init": ("pytorch", "gpt2"),
           "rope_scaling": ("none", "linear", "dynamic", "llama3")}
BOOLS = ("norm_affine", "norm_bias", "qk_norm", "qkv_bias", "out_bias", "ffn_bias", "head_bias", "tie_embeddings",
         "parallel_residual", "norm_unit_offset")
# Non-negative numbers, 0 meaning off (or, for attn_scale, 1 / sqrt(D)); embed_scale is positive.
SCALES = ("rope_local_theta", "attn_scale", "attn_softcap", "embed_scale", "final_softcap")
# The value a field has in files written before it existed (num_kv_heads 0: num_heads).
CLASSIC = {"num_kv_heads": 0, "head_dim": 0, "sliding_window": 0, "norm_kind": "layer_norm", "norm_eps": 1e-5, "norm_affine": True, "norm_bias": True,
           "activation": "gelu", "positional": "learned", "rope_theta": 10000.0, "rotary_dim": 0, "qk_norm": False,
           "rope_scaling": "none", "rope_factor": 1.0, "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0,
           "rope_original_max_len": 0,
           "qkv_bias": True, "out_bias": True, "ffn_bias": True, "head_bias": True, "tie_embeddings": False,
           "init": "pytorch", "parallel_residual": False, "norm_unit_offset": False, "full_attention_layers": [],
           "rope_local_theta": 0.0, "attn_scale": 0.0, "attn_softcap": 0.0, "embed_scale": 1.0, "final_softcap": 0.0}
DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
          "U8": "u1", "BOOL": "?"}


def load_safetensors(path):
    """({name: numpy array}, {metadata key: value}) of any safetensors file (BF16 becomes float32)."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little") if len(raw) >= 8 else -1
    if n < 0 or n > len(raw) - 8:
        raise ValueError("%s is not a safetensors file (header length %d, file size %d)" % (path, n, len(raw)))
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if not 0 <= begin <= end <= len(data):
            raise ValueError("%s: tensor %s lies outside the file (bytes %d..%d of %d)" % (path, name, begin, end,
                                                                                          len(data)))
        if info["dtype"] == "BF16":
            bits = np.frombuffer(data[begin:end], dtype="<u2").astype(np.uint32) << 16
            tensors[name] = bits.view(np.float32).reshape(info["shape"])
        elif info["dtype"] in DTYPES:
            tensors[name] = np.frombuffer(data[begin:end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"]).copy()
        else:
            raise ValueError("%s: tensor %s has dtype %s, which this tool does not read" % (path, name, info["dtype"]))
    return tensors, header.get("__metadata__", {})


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: numpy array} (float32, float16, int64, bool, ...) in the given order, with text
    metadata; the header is padded with spaces so the data starts 8-byte aligned. Atomic: a
    temporary file next to path, then renamed over it."""
    names = {np.dtype(v): k for k, v in DTYPES.items()}
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, array in tensors.items():
        a = np.asarray(array, order="C")  # (np.ascontiguousarray makes a 0-d array 1-d)
        a = a.astype(a.dtype.newbyteorder("<")) if a.dtype.byteorder == ">" else a
        if a.dtype not in names:
            raise ValueError("save_safetensors: tensor %s has dtype %s, which safetensors cannot hold" % (name, a.dtype))
        blob = a.tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    temporary = path + ".tmp"
    with open(temporary, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))
    os.replace(temporary, path)


def head_dim(o):
    """D: head_dim, or d_model / num_heads when it is 0."""
    return o["head_dim"] or o["d_model"] // o["num_heads"]


def complete_options(stored, who):
    """The stored options with every field the file lacks at its classic value, checked: an unknown
    field (an architecture this tool cannot build), a missing count, a value of the wrong type or
    out of range is a ValueError naming who and the field."""
    o = dict(stored)
    if "layer_norm_eps" in o:  # files written before norm_eps existed
        if "norm_eps" in o:
            raise ValueError("%s: the model options hold both norm_eps and its old name layer_norm_eps" % who)
        o["norm_eps"] = o.pop("layer_norm_eps")
    known = set(COUNTS) | set(CLASSIC) | {"dropout", "norm"}
    unknown = sorted(set(o) - known)
    if unknown:
        raise ValueError("%s: unknown model option %s (this tool cannot build that architecture)" % (who, unknown[0]))
    for name in COUNTS + ("dropout", "norm"):
        if name not in o:
            raise ValueError("%s: the model options have no field %s" % (who, name))
    for name, value in CLASSIC.items():
        o.setdefault(name, value)
    if o["num_kv_heads"] is None or type(o["num_kv_heads"]) is int and o["num_kv_heads"] == 0:
        o["num_kv_heads"] = o["num_heads"]  # 0: one key/value head per query head, as xgrad writes it
    bad = lambda name, why: ValueError("%s: model option %s = %s %s" % (who, name, json.dumps(o[name]), why))
    zero_ok = ("rotary_dim", "head_dim", "sliding_window", "rope_original_max_len")
    for name in COUNTS + ("num_kv_heads",) + zero_ok:
        v = o[name]
        count = name in zero_ok  # 0 allowed
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if count else 1):
            if not (name == "max_len" and v is None):  # a format-1 file with sinusoidal positions
                raise bad(name, "is not a positive whole number" if not count else "is not a count")
    for name in ("dropout", "norm_eps", "rope_theta", "rope_factor", "rope_low_freq_factor",
                 "rope_high_freq_factor") + SCALES:
        if isinstance(o[name], bool) or not isinstance(o[name], (int, float)) or not math.isfinite(o[name]):
            raise bad(name, "is not a finite number")
    for name, choices in CHOICES.items():
        if o[name] not in choices:
            raise bad(name, "is not one of " + ", ".join(choices))
    for name in BOOLS:
        if not isinstance(o[name], bool):
            raise bad(name, "is not true or false")
    for name in SCALES:
        if o[name] < 0 or (name == "embed_scale" and o[name] == 0):
            raise bad(name, "is not positive" if name == "embed_scale" else "is negative")
    layers = o["full_attention_layers"]
    if not isinstance(layers, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in layers) or \
            layers != sorted(set(layers)) or any(not 0 <= i < o["num_layers"] for i in layers):
        raise bad("full_attention_layers", "is not a list of block indexes in increasing order")
    if (layers or o["rope_local_theta"]) and not o["sliding_window"]:
        raise bad("full_attention_layers" if layers else "rope_local_theta", "needs a sliding_window")
    if o["norm_unit_offset"] and (o["norm_kind"] != "rms_norm" or not o["norm_affine"]):
        raise bad("norm_unit_offset", "needs an RMSNorm with a weight")
    if not 0 <= o["dropout"] < 1:
        raise bad("dropout", "is not in [0, 1)")
    if o["norm_eps"] <= 0 or o["rope_theta"] <= 0:
        raise bad("norm_eps" if o["norm_eps"] <= 0 else "rope_theta", "is not positive")
    if not o["head_dim"] and o["d_model"] % o["num_heads"]:
        raise bad("num_heads", "does not divide d_model %d" % o["d_model"])
    if o["num_heads"] % o["num_kv_heads"]:
        raise bad("num_kv_heads", "does not divide num_heads %d" % o["num_heads"])
    d = head_dim(o)
    if o["rotary_dim"] % 2 or o["rotary_dim"] > d:
        raise bad("rotary_dim", "is not an even count up to the head size %d" % d)
    if o["positional"] == "rotary" and (o["rotary_dim"] or d) % 2:
        raise bad("positional", "needs an even head size for the rotary positions, not %d" % d)
    return o


def read_checkpoint(path):
    """({name: float32 array} of the model's tensors, the stored model options or None) of an xgrad
    checkpoint; the options as stored, before complete_options."""
    tensors, meta = load_safetensors(path)
    fmt = meta.get("xgrad.checkpoint")
    if fmt not in (None, "2"):
        raise ValueError("%s has checkpoint format %r; this tool reads formats 1 and 2" % (path, fmt))
    optimizer = "optimizer." if fmt is None else "optimizer:"  # format 1 / format 2
    options = json.loads(meta["xgrad.model_options"]) if fmt == "2" and "xgrad.model_options" in meta else None
    out = {}
    for name, a in tensors.items():
        if name.startswith(optimizer):
            continue
        if a.dtype != np.float32:
            raise ValueError("%s: tensor %s has dtype %s, expected F32" % (path, name, a.dtype))
        name = re.sub(r"^(blocks\.\d+\.)ffn_norm\.", r"\1ffn.norm.", name)  # checkpoints before the rename
        out[name] = a
    return out, options


class Norm(nn.Module):
    """LayerNorm, or RMSNorm x / sqrt(mean(x^2) + eps) * weight in float32 (Hugging Face's
    LlamaRMSNorm; with unit_offset * (1 + weight), Gemma's), over the last axis; weight when affine,
    bias for a LayerNorm with bias."""

    def __init__(self, width, kind, eps, affine=True, bias=True, unit_offset=False):
        super().__init__()
        self.kind, self.eps, self.offset = kind, eps, 1.0 if unit_offset else 0.0
        self.weight = nn.Parameter(torch.ones(width) - self.offset) if affine else None
        self.bias = nn.Parameter(torch.zeros(width)) if affine and bias and kind == "layer_norm" else None

    def forward(self, x):
        if self.kind == "layer_norm":
            return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.to(x.dtype) if self.weight is None else (self.offset + self.weight) * y.to(x.dtype)


def norm_of(o):
    return Norm(o["d_model"], o["norm_kind"], o["norm_eps"], o["norm_affine"], o["norm_bias"], o["norm_unit_offset"])


def windowed(o, layer):
    """Whether block `layer` attends through the sliding window (full_attention_layers opt out)."""
    return o["sliding_window"] > 0 and layer not in o["full_attention_layers"]


def inv_freq(r, theta, o, length):
    """theta^(-2i/r), scaled by the options' rope_scaling as transformers 4.57's modeling_rope_utils
    computes it in float32 (dynamic: from length, the call's last position + 1)."""
    kind, factor = o["rope_scaling"], o["rope_factor"]
    n = o["rope_original_max_len"]
    if kind == "dynamic" and length > n:
        theta = theta * ((factor * length / n) - (factor - 1)) ** (r / (r - 2))
    f = 1.0 / (theta ** (torch.arange(0, r, 2, dtype=torch.int64).float() / r))
    if kind == "linear":
        f = f / factor
    elif kind == "llama3":
        low, high = o["rope_low_freq_factor"], o["rope_high_freq_factor"]
        wavelen = 2 * math.pi / f
        scaled = torch.where(wavelen > n / low, f / factor, f)
        smooth = (n / wavelen - low) / (high - low)
        medium = ~(wavelen < n / high) * ~(wavelen > n / low)
        f = torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    return f


def rotate(x, positions, r, theta, o):
    """Hugging Face's rotate_half RoPE on the first r channels of each head of x (B, H, T, D), at
    positions (B, T): channel i pairs with i + r/2, inv_freq_i = theta^(-2i/r) (scaled as the
    options o say); the other D - r channels pass (GPT-NeoX's partial rotary)."""
    freq = inv_freq(r, theta, o, int(positions.max()) + 1)
    freqs = positions.float()[:, None, :, None] * freq  # (B, 1, T, r/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    rot, rest = x[..., :r], x[..., r:]
    half = torch.cat((-rot[..., r // 2:], rot[..., :r // 2]), dim=-1)
    return torch.cat((rot * emb.cos() + half * emb.sin(), rest), dim=-1)


class Attention(nn.Module):
    """softmax(cap(Q_h K_{h/(H/KV)}^T * scale) + causal and padding masks) V, heads concatenated,
    then w_o, with scale attn_scale or 1 / sqrt(D) and cap s -> c tanh(s / c) for attn_softcap c;
    QK-norm and RoPE on q and k first when the options ask for them. Block `layer` takes the
    sliding window unless full_attention_layers lists it, and then rope_local_theta without scaling."""

    def __init__(self, o, layer=0):
        super().__init__()
        c, self.heads, self.kv_heads = o["d_model"], o["num_heads"], o["num_kv_heads"]
        d = self.head_dim = head_dim(o)
        self.w_q = nn.Linear(c, self.heads * d, bias=o["qkv_bias"])
        self.w_k = nn.Linear(c, self.kv_heads * d, bias=o["qkv_bias"])
        self.w_v = nn.Linear(c, self.kv_heads * d, bias=o["qkv_bias"])
        self.w_o = nn.Linear(self.heads * d, c, bias=o["out_bias"])
        if o["qk_norm"]:
            self.q_norm = Norm(d, "rms_norm", o["norm_eps"], unit_offset=o["norm_unit_offset"])
            self.k_norm = Norm(d, "rms_norm", o["norm_eps"], unit_offset=o["norm_unit_offset"])
        self.rotary_dim = (o["rotary_dim"] or d) if o["positional"] == "rotary" else 0
        self.rope_theta, self.options = o["rope_theta"], o
        self.window = o["sliding_window"] if windowed(o, layer) else 0
        if self.window and o["rope_local_theta"]:
            self.rope_theta, self.options = o["rope_local_theta"], dict(o, rope_scaling="none")
        self.scale, self.cap = o["attn_scale"] or 1.0 / math.sqrt(d), o["attn_softcap"]
        self.dropout = nn.Dropout(o["dropout"])

    def forward(self, x, positions, padding=None):
        """x (B, T, C), positions (B, T), padding (B, T) true = padding key, or None -> (out (B, T, C),
        weights (B, H, T, T) before dropout; a query with every key masked gets zeros)."""
        b, t, _ = x.shape
        split = lambda y, n: y.reshape(b, t, n, self.head_dim).transpose(1, 2)  # (B, n, T, D)
        q, k, v = split(self.w_q(x), self.heads), split(self.w_k(x), self.kv_heads), split(self.w_v(x), self.kv_heads)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary_dim:
            q = rotate(q, positions, self.rotary_dim, self.rope_theta, self.options)
            k = rotate(k, positions, self.rotary_dim, self.rope_theta, self.options)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # Hugging Face's repeat_kv
        scores = q @ k.transpose(-2, -1) * self.scale
        if self.cap:
            scores = torch.tanh(scores / self.cap) * self.cap
        blocked = torch.ones(t, t, dtype=torch.bool).triu(1)
        if self.window:  # query i sees keys i - window + 1 .. i
            blocked = blocked | torch.ones(t, t, dtype=torch.bool).tril(-self.window)
        if padding is not None:
            blocked = blocked | padding[:, None, None, :]
        none_left = blocked.all(-1, keepdim=True)
        weights = scores.masked_fill(blocked, float("-inf")).masked_fill(none_left, 0).softmax(-1)
        weights = weights.masked_fill(none_left, 0)
        out = (self.dropout(weights) @ v).transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        return self.w_o(out), weights


class FeedForward(nn.Module):
    """linear2(act(linear1(x))), or gated linear2(act(gate(x)) * linear1(x))."""

    def __init__(self, o):
        super().__init__()
        c, f, bias = o["d_model"], o["d_ff"], o["ffn_bias"]
        self.act, gated = ACTIVATIONS[o["activation"]]
        self.linear1 = nn.Linear(c, f, bias=bias)
        if gated:
            self.gate = nn.Linear(c, f, bias=bias)
        self.linear2 = nn.Linear(f, c, bias=bias)
        self.dropout = nn.Dropout(o["dropout"])

    def forward(self, x):
        hidden = self.act(self.gate(x)) * self.linear1(x) if hasattr(self, "gate") else self.act(self.linear1(x))
        return self.linear2(self.dropout(hidden))


class Block(nn.Module):
    """Pre-Norm x + f(norm(x)), Post-Norm norm(x + f(x)), sandwich x + post_norm(f(norm(x))), for
    f = attn, then ffn; each owns its norms. With parallel_residual (Pre-Norm): x + attn(norm1(x)) +
    ffn(norm2(x))."""

    def __init__(self, o, layer=0):
        super().__init__()
        self.pre, self.attn, self.ffn = o["norm"] != "post", Attention(o, layer), FeedForward(o)
        self.parallel = o["parallel_residual"]
        self.attn.norm, self.ffn.norm = norm_of(o), norm_of(o)
        if o["norm"] == "sandwich":
            self.attn.post_norm, self.ffn.post_norm = norm_of(o), norm_of(o)

    def forward(self, x, positions, padding=None):
        a, weights = self.attn(self.attn.norm(x) if self.pre else x, positions, padding)
        if hasattr(self.attn, "post_norm"):
            a = self.attn.post_norm(a)
            x = x + a
            return x + self.ffn.post_norm(self.ffn(self.ffn.norm(x))), weights
        if self.parallel:
            return x + a + self.ffn(self.ffn.norm(x)), weights
        x = x + a if self.pre else self.attn.norm(x + a)
        x = x + self.ffn(self.ffn.norm(x)) if self.pre else self.ffn.norm(x + self.ffn(x))
        return x, weights


def sinusoid(positions, c):
    """PE[t, j] = sin(t / 10000^((j - j % 2) / C)) for even j, cos for odd j, at positions (B, T),
    in double as xgrad computes it, then float32: (B, T, C)."""
    j = np.arange(c)
    angle = positions.numpy().astype(np.float64)[..., None] * np.power(10000.0, -(j - j % 2) / c)
    return torch.from_numpy(np.where(j % 2 == 0, np.sin(angle), np.cos(angle)).astype(np.float32))


class LanguageModel(nn.Module):
    """xgrad's LanguageModel for complete options (complete_options): h = tok_emb(ids) + positions,
    the blocks, final_norm for Pre-Norm, logits = head(h) or h tok_emb.weight^T when tied."""

    def __init__(self, options):
        super().__init__()
        o = self.options = options
        self.max_len = o["max_len"]  # None: unknown (a format-1 file with sinusoidal positions)
        self.tok_emb = nn.Embedding(o["vocab_size"], o["d_model"])
        if o["positional"] == "learned":
            self.pos_emb = nn.Embedding(o["max_len"], o["d_model"])  # the same parameter name, "pos_emb.weight"
        self.blocks = nn.ModuleList(Block(o, n) for n in range(o["num_layers"]))
        self.final_norm = norm_of(o) if o["norm"] != "post" else None
        if not o["tie_embeddings"]:
            self.head = nn.Linear(o["d_model"], o["vocab_size"], bias=o["head_bias"])

    def forward(self, ids, key_padding_mask=None, return_attentions=False):
        """ids (B, T) int64 -> logits (B, T, V), with return_attentions also one (B, H, T, T) per block.
        key_padding_mask (B, T), true = padding: no query attends to it, and position (b, t) counts
        row b's tokens before t that are not padding."""
        b, t = ids.shape
        if self.max_len is not None and t > self.max_len:
            raise ValueError("sequence length %d exceeds max_len %d" % (t, self.max_len))
        if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < self.tok_emb.num_embeddings:
            raise ValueError("token ids must lie in [0, %d)" % self.tok_emb.num_embeddings)
        if key_padding_mask is None:
            positions = torch.arange(t).expand(b, t)
        else:
            if tuple(key_padding_mask.shape) != (b, t):
                raise ValueError("key_padding_mask of shape %s does not match ids of shape %s" %
                                 (tuple(key_padding_mask.shape), (b, t)))
            key_padding_mask = key_padding_mask.bool()
            real = (~key_padding_mask).long()
            positions = real.cumsum(1) - real  # exclusive
        h = self.tok_emb(ids)
        if self.options["embed_scale"] != 1.0:
            h = h * self.options["embed_scale"]
        if self.options["positional"] == "learned":
            h = h + self.pos_emb(positions)
        elif self.options["positional"] == "sinusoidal":
            h = h + sinusoid(positions, self.tok_emb.embedding_dim)
        attentions = []
        for block in self.blocks:
            h, weights = block(h, positions, key_padding_mask)
            attentions.append(weights)
        if self.final_norm is not None:
            h = self.final_norm(h)
        logits = h @ self.tok_emb.weight.t() if self.options["tie_embeddings"] else self.head(h)
        if self.options["final_softcap"]:
            logits = torch.tanh(logits / self.options["final_softcap"]) * self.options["final_softcap"]
        return (logits, attentions) if return_attentions else logits

    def loss(self, ids, targets, key_padding_mask=None):
        """Mean cross-entropy of the next-token logits against targets (B, T), -100 ignored."""
        logits = self.forward(ids, key_padding_mask)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def check_asked(options, num_heads, activation, norm_eps):
    """Raises naming every argument that contradicts the stored options (eps compared as float32)."""
    asked = [("num_heads", num_heads, num_heads is not None and num_heads != options["num_heads"]),
             ("activation", activation, activation is not None and activation != options["activation"]),
             ("norm_eps", norm_eps, norm_eps is not None and np.float32(norm_eps) != np.float32(options["norm_eps"]))]
    wrong = ["%s %s in the file, %s asked" % (name, options[name], value) for name, value, differs in asked if differs]
    if wrong:
        raise ValueError("the stored model options contradict the ones asked for: " + "; ".join(wrong))


def format1_options(path, w, num_heads, activation, norm_eps):
    """The classic architecture of a file without stored options, from its tensors and the arguments."""
    if num_heads is None:
        raise ValueError("%s stores no model options (a checkpoint from before format 2): give num_heads" % path)
    layers = len({int(m.group(1)) for m in map(re.compile(r"blocks\.(\d+)\.").match, w) if m})
    if "tok_emb.weight" not in w or layers == 0:
        raise ValueError("%s is not an xgrad LanguageModel checkpoint (no tok_emb.weight or blocks.N.*)" % path)
    vocab, c = w["tok_emb.weight"].shape
    learned = "pos_emb.weight" in w
    o = {"vocab_size": vocab, "d_model": c, "num_heads": num_heads, "num_layers": layers,
         "d_ff": w["blocks.0.ffn.linear1.weight"].shape[0], "max_len": w["pos_emb.weight"].shape[0] if learned else None,
         "dropout": 0.0, "norm": "pre" if "final_norm.weight" in w else "post",
         "positional": "learned" if learned else "sinusoidal", "activation": activation or "gelu",
         "norm_eps": 1e-5 if norm_eps is None else norm_eps}
    return complete_options(o, path)


def load_xgrad_lm(path, num_heads=None, activation=None, norm_eps=None):
    """The xgrad LanguageModel saved at path as a torch.nn.Module in eval mode."""
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError("activation %r is not one of %s" % (activation, ", ".join(ACTIVATIONS)))
    w, stored = read_checkpoint(path)
    if stored is not None:
        options = complete_options(stored, path)
        check_asked(options, num_heads, activation, norm_eps)
    else:
        options = format1_options(path, w, num_heads, activation, norm_eps)
    model = LanguageModel(options)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in w.items()})  # strict: names and shapes must match
    return model.eval()


def llama_name(name):
    """LlamaForCausalLM's name for an xgrad parameter name."""
    fixed = {"tok_emb.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight",
             "head.weight": "lm_head.weight"}
    if name in fixed:
        return fixed[name]
    m = re.match(r"blocks\.(\d+)\.(.+)$", name)
    parts = {"attn.norm.weight": "input_layernorm.weight", "ffn.norm.weight": "post_attention_layernorm.weight",
             "attn.w_q.weight": "self_attn.q_proj.weight", "attn.w_k.weight": "self_attn.k_proj.weight",
             "attn.w_v.weight": "self_attn.v_proj.weight", "attn.w_o.weight": "self_attn.o_proj.weight",
             "ffn.gate.weight": "mlp.gate_proj.weight", "ffn.linear1.weight": "mlp.up_proj.weight",
             "ffn.linear2.weight": "mlp.down_proj.weight"}
    if not m or m.group(2) not in parts:
        raise ValueError("parameter %s has no place in the Llama layout" % name)
    return "model.layers.%s.%s" % (m.group(1), parts[m.group(2)])


def llama_obstacles(o):
    """The fields (as 'field value') of complete options that the Llama layout cannot express."""
    d = head_dim(o)
    need = [("norm", "pre"), ("norm_kind", "rms_norm"), ("norm_affine", True), ("positional", "rotary"),
            ("activation", "swiglu"), ("qk_norm", False), ("qkv_bias", False), ("out_bias", False),
            ("ffn_bias", False), ("parallel_residual", False), ("sliding_window", 0), ("norm_unit_offset", False),
            ("attn_scale", 0.0), ("attn_softcap", 0.0), ("embed_scale", 1.0), ("final_softcap", 0.0)]
    out = ["%s %s (Llama has %s)" % (f, json.dumps(o[f]), json.dumps(v)) for f, v in need if o[f] != v]
    if o["positional"] == "rotary" and o["rotary_dim"] not in (0, d):
        out.append("rotary_dim %d (Llama rotates all %d channels of a head)" % (o["rotary_dim"], d))
    if not o["tie_embeddings"] and o["head_bias"]:
        out.append("head_bias true (Llama's lm_head has no bias)")
    return out


def f32_json(v):
    """The shortest decimal that reads back as the same float32 (1e-06 for the float32 nearest 1e-6)."""
    x = np.float32(v)
    short = float(str(x))
    return short if np.float32(short) == x else float(x)


def rope_scaling_config(o):
    """config.json's rope_scaling for the options' scaling (None without one)."""
    kind = o["rope_scaling"]
    if kind == "none":
        return None
    out = {"rope_type": kind, "factor": f32_json(o["rope_factor"])}
    if kind == "llama3":
        out.update({"low_freq_factor": f32_json(o["rope_low_freq_factor"]),
                    "high_freq_factor": f32_json(o["rope_high_freq_factor"]),
                    "original_max_position_embeddings": o["rope_original_max_len"]})
    return out


def llama_config(o):
    """config.json of LlamaForCausalLM for complete options that llama_obstacles passes (dynamic
    RoPE: Hugging Face takes the trained context from max_position_embeddings)."""
    dynamic = o["rope_scaling"] == "dynamic"
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": o["vocab_size"],
            "hidden_size": o["d_model"], "intermediate_size": o["d_ff"], "num_hidden_layers": o["num_layers"],
            "num_attention_heads": o["num_heads"], "num_key_value_heads": o["num_kv_heads"],
            "head_dim": head_dim(o), "hidden_act": "silu",
            "max_position_embeddings": o["rope_original_max_len"] if dynamic else o["max_len"],
            "rms_norm_eps": f32_json(o["norm_eps"]), "rope_theta": f32_json(o["rope_theta"]),
            "rope_scaling": rope_scaling_config(o), "tie_word_embeddings": o["tie_embeddings"],
            "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "torch_dtype": "float32"}


def write_hf_llama(path, out_dir):
    """Writes the Llama-style checkpoint at path as out_dir/config.json and out_dir/model.safetensors
    (LlamaForCausalLM's names, float32; no lm_head.weight when tied). Returns the config."""
    w, stored = read_checkpoint(path)
    if stored is None:
        raise ValueError("%s stores no model options (a checkpoint from before format 2), so it is no Llama-style "
                         "model: --hf-out needs rms_norm, rotary positions and swiglu" % path)
    o = complete_options(stored, path)
    obstacles = llama_obstacles(o)
    if obstacles:
        raise ValueError("--hf-out: the Llama layout cannot express %s's %s" % (path, "; ".join(obstacles)))
    LanguageModel(o).load_state_dict({k: torch.from_numpy(v) for k, v in w.items()})  # the names and shapes
    os.makedirs(out_dir, exist_ok=True)
    config = llama_config(o)
    save_safetensors(os.path.join(out_dir, "model.safetensors"), {llama_name(k): v for k, v in w.items()},
                     {"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return config


def token_ids(text):
    return [int(i) for i in text.split(",")]


def main():
    p = argparse.ArgumentParser(description="Run an xgrad LanguageModel checkpoint in PyTorch, or write a "
                                            "Llama-style one as a Hugging Face directory.")
    p.add_argument("checkpoint")
    p.add_argument("--heads", type=int, help="num_heads: required for a file without stored options, else checked")
    p.add_argument("--activation", choices=sorted(ACTIVATIONS), help="default: the file's, or gelu")
    p.add_argument("--eps", type=float, help="the norms' eps; default: the file's, or 1e-5")
    p.add_argument("--ids", type=token_ids, help="comma-separated token ids, e.g. 1,2,3: prints the logits (T, V)")
    p.add_argument("--argmax", action="store_true", help="print the most likely next token per position")
    p.add_argument("--hf-out", metavar="DIR", help="write config.json and model.safetensors of LlamaForCausalLM")
    a = p.parse_args()
    if a.ids is None and a.hf_out is None:
        p.error("give --ids, --hf-out or both")
    try:
        if a.hf_out is not None:
            write_hf_llama(a.checkpoint, a.hf_out)
        if a.ids is None:
            return
        model = load_xgrad_lm(a.checkpoint, a.heads, a.activation, a.eps)
        with torch.no_grad():
            logits = model(torch.tensor([a.ids]))[0]  # (T, V)
    except (OSError, ValueError, KeyError, IndexError, RuntimeError) as e:
        sys.exit("xgrad_to_torch: %s" % e)
    for row in logits:
        print(int(row.argmax()) if a.argmax else " ".join("%.6g" % v for v in row.tolist()))


if __name__ == "__main__":
    main()

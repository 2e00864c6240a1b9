#!/usr/bin/python3
"""Times one full PyTorch training step of the language model that xgrad's train-step benchmark
times (forward, mean next-token cross-entropy, backward, AdamW step, zero_grad), so the two can be
compared side by side. bench/compare.py runs it with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
removed from its environment, so that OpenBLAS chooses its own kernel for the CPU (on this
machine's AVX-512 EPYC: Cooperlake, whose 512^3 sgemm ran at about 200 GFLOP/s on one thread,
against about 104 for the Haswell kernel that OPENBLAS_CORETYPE=Haswell forces); the kernel that
ran is in the output line.

The model mirrors xgrad's nn/transformer.cpp LanguageModel with Pre-Norm placement and learned
positions (the same modules as tests/fixtures/make_nn_fixtures.py, copied here with dropout added
so that the benchmark does not depend on test files):
  h = tok_emb(ids) + pos_emb[:T]
  per block:  x = x + W_o(Attn(LN1(x)))                       q, k, v from three Linears w_q, w_k,
                                                              w_v (--formulation separate) or one
                                                              Linear `qkv` (C, 3C) split in three
                                                              (fused_qkv, as nanoGPT); then w_o,
                                                              softmax(QK^T / sqrt(D) + causal mask),
                                                              dropout 0.1 on the attention weights
              x = x + linear2(dropout(GELU(linear1(LN2(x)))))  exact erf GELU, dropout 0.1
  logits = head(final_norm(h))                                 head is a Linear with bias
gpt2_124m is xgrad's gpt2_style at GPT-2 small's size: the same with the tanh GELU, the head tied to
tok_emb (no bias) and GPT-2 initialization.
The llama_ configurations mirror xgrad's LanguageModelOptions::llama_style at the same sizes,
written with Hugging Face's Llama formulas (no fused kernel either):
  h = tok_emb(ids)                                             no position table
  per block:  x = x + w_o(Attn(RMSNorm(x)))                    RMSNorm in float32, eps 1e-5;
                                                              KV key/value heads; RoPE on q and k
                                                              (rotate_half, theta 10000, cos and sin
                                                              tables built once); repeat_kv; the
                                                              same masked softmax and dropout
              x = x + linear2(dropout(silu(gate(y)) * linear1(y)))   y = RMSNorm(x); dropout 0.1
  logits = head(final_norm(h))                                 no biases anywhere; head untied
  GPT-2 initialization: Linear weights and tok_emb N(0, 0.02), w_o and linear2 N(0, 0.02 / sqrt(2 L)).
Shapes: B batch, T length, C d_model, H heads, KV key/value heads, D head size (C / H),
V vocabulary, F FFN width.

--precision bf16 runs forward and loss under torch.autocast("cpu", dtype=torch.bfloat16) and
backward outside it, with float32 parameters and AdamW (PyTorch's recipe for CPU mixed precision);
its products run in oneDNN's bfloat16 kernels (torch 1.13's mkldnn), on torch's intra-op threads.

--formulation: fused_qkv builds the three projections as separate does (same random draws) and
concatenates their weights and biases by rows into `qkv`, so both formulations start from the same
weights and, for one seed, give the same losses (first_loss and last_loss agree to a few float32
ulps). The default is separate, the faster here: PyTorch fp32 on one thread, the two alternating
in 12 rounds (6, 10 and 20 timed steps) on the shared 2-core machine, load average 1.9 to 6.6,
OpenBLAS's Cooperlake kernel; the median over the rounds of separate's step time over fused's
was 0.995 on small and 0.96 on standard (single rounds ranged 0.72 to 1.56 and 0.79 to 1.18:
the machine's noise is larger than the difference). Fusing saves nothing measurable here:
the one wider product is no faster in OpenBLAS, and its backward concatenates the three
gradients into one (3C)-wide tensor, a copy the three Linears do not make.
torch 1.13 has no torch.nn.functional.scaled_dot_product_attention (it came in 2.0), so the
attention is written out; the output line says whether the running torch has it.

Prints exactly one JSON line on stdout:
  {"impl": "pytorch", "config", "precision", "formulation", "threads" (OpenBLAS's),
   "intra_op_threads" (torch's own), "parameters" (the model's scalar parameters),
   "ms_per_step" (median over the timed steps),
   "tokens_per_s" (B*T / median seconds), "peak_rss_mb" (the process's resident peak, ru_maxrss /
   1024, as bench_train_step reports it), "gflops" (matmul FLOPs of forward + backward / median
   seconds / 1e9), "gemm_peak_gflops" (the best of 50 512^3 torch.matmul in the precision's dtype,
   after the step's measurements), "peak_fraction" (gflops over it), "first_loss", "last_loss",
   "openblas_corename" (the kernel the loaded OpenBLAS chose), "scaled_dot_product_attention"
   (whether this torch has it), "torch_version"}
Anything else goes to stderr.

Run one configuration per process, so peak memory is per configuration (Debian's python3-torch;
the python3 on PATH has no torch):
    /usr/bin/python3 bench/torch_train_step.py --config small --threads 1
    /usr/bin/python3 bench/torch_train_step.py --check      # 30 tiny steps: the loss must fall
"""

import argparse
import contextlib
import ctypes
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# name: (V vocab, C d_model, H heads, layers, F ffn, T seq_len, B batch)
CONFIGS = {
    "tiny": (16, 64, 4, 2, 256, 32, 64),
    "small": (256, 256, 4, 4, 1024, 64, 32),
    "standard": (512, 512, 8, 2, 2048, 128, 8),
    "long": (256, 256, 4, 2, 1024, 1024, 2),
    "long4k": (256, 256, 4, 2, 1024, 4096, 1),  # 16M scores per head: memory at length
    # F = 8C/3 rounded up to a multiple of 8 (xgrad's llama_style)
    "llama_small": (256, 256, 4, 4, 688, 64, 32),
    "llama_standard": (512, 512, 8, 2, 1368, 128, 8),
    "gpt2_124m": (50257, 768, 12, 12, 3072, 256, 4),  # GPT-2 small's shape, head tied to tok_emb
}
GPT2 = {"gpt2_124m"}  # xgrad's gpt2_style: tanh GELU, the head tied to tok_emb (no bias), GPT-2 init
KV_HEADS = {"llama_small": 2, "llama_standard": 2}  # the Llama-style configurations' key/value heads
ROPE_THETA = 10000.0
DROPOUT = 0.1     # xgrad's default, on the attention weights and the FFN hidden activation
EPS = 1e-5        # xgrad's LayerNorm default
LR = 1e-3         # AdamW; weight decay 0.01, betas (0.9, 0.999), eps 1e-8: PyTorch's and xgrad's defaults
CHECK_STEPS = 30


# ---- the model (names match xgrad's named_parameters()) ----

class MultiHeadAttention(nn.Module):
    """Pre-Norm y = x + W_o(Attn(LN(x))), attention written out (no fused kernel, no nn.MultiheadAttention)."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0
        self.h = num_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model, eps=EPS)
        self.attn_dropout = nn.Dropout(DROPOUT)
        self.qkv = None  # fuse_qkv() sets it

    def forward(self, x, blocked):
        b, t, c = x.shape
        h, d = self.h, c // self.h
        inp = self.norm(x)

        def heads(y):  # (B, T, C) -> (B, T, H, D) -> (B, H, T, D)
            return y.reshape(b, t, h, d).permute(0, 2, 1, 3)

        if self.qkv is not None:  # one (C, 3C) product, split as nanoGPT does
            q, k, v = (heads(y) for y in self.qkv(inp).split(c, dim=-1))
        else:
            q, k, v = heads(self.w_q(inp)), heads(self.w_k(inp)), heads(self.w_v(inp))
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d))  # (B, H, T, S)
        scores = scores.masked_fill(blocked, float("-inf"))
        weights = F.softmax(scores, dim=-1)
        attended = self.attn_dropout(weights)
        context = torch.matmul(attended, v).permute(0, 2, 1, 3).reshape(b, t, c)  # (B, H, T, D) -> (B, T, C)
        return x + self.w_o(context)


class FeedForward(nn.Module):
    """linear2(dropout(gelu(linear1(x)))) with the exact erf GELU, or its tanh form (gpt2_124m)."""

    def __init__(self, d_model, d_ff, gelu="none"):
        super().__init__()
        self.gelu = gelu  # F.gelu's approximate: "none" (erf) or "tanh"
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(DROPOUT)
        self.norm = nn.LayerNorm(d_model, eps=EPS)  # the residual connection's, applied by the block

    def forward(self, x):
        return self.linear2(self.dropout(F.gelu(self.linear1(x), approximate=self.gelu)))


class TransformerBlock(nn.Module):
    """Pre-Norm: x = x + Attn(attn.norm(x)); y = x + FFN(ffn.norm(x))."""

    def __init__(self, d_model, num_heads, d_ff, gelu="none"):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = FeedForward(d_model, d_ff, gelu)

    def forward(self, x, blocked):
        h = self.attn(x, blocked)
        return h + self.ffn(self.ffn.norm(h))


def gpt2_init(model, num_layers):
    """GPT-2's initialization, as xgrad's Init::gpt2: weights and embeddings N(0, 0.02), w_o and
    linear2 N(0, 0.02 / sqrt(2 L)), biases 0, norms as they are."""
    for name, p in model.named_parameters():
        if "norm." in name:
            continue
        if name.endswith("bias"):
            nn.init.zeros_(p)
            continue
        std = 0.02 / math.sqrt(2 * num_layers) if name.endswith(("w_o.weight", "linear2.weight")) else 0.02
        nn.init.normal_(p, 0.0, std)


class LearnedPositions(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(max_len, d_model))  # N(0, 1), as xgrad

    def forward(self, length):
        return self.weight[:length]


class LanguageModel(nn.Module):
    """h = tok_emb(ids) + pos_emb[:T]; causal Pre-Norm blocks; final_norm; head."""

    def __init__(self, vocab, d_model, num_heads, num_layers, d_ff, max_len, gpt2=False):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)  # N(0, 1)
        self.pos_emb = LearnedPositions(max_len, d_model)
        gelu = "tanh" if gpt2 else "none"
        self.blocks = nn.ModuleList([TransformerBlock(d_model, num_heads, d_ff, gelu) for _ in range(num_layers)])
        self.final_norm = nn.LayerNorm(d_model, eps=EPS)
        self.head = nn.Linear(d_model, vocab, bias=not gpt2)
        if gpt2:  # xgrad's gpt2_style: the head is tok_emb's weight, GPT-2 initialization
            self.head.weight = self.tok_emb.weight
            gpt2_init(self, num_layers)

    def forward(self, ids):
        t = ids.shape[1]
        h = self.tok_emb(ids) + self.pos_emb(t)  # (B, T, C)
        blocked = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)  # (T, S), true = key after query
        for block in self.blocks:
            h = block(h, blocked)
        return self.head(self.final_norm(h))  # (B, T, V)


# ---- the Llama-style model (Hugging Face's formulas; names match xgrad's named_parameters()) ----

class RMSNorm(nn.Module):
    """LlamaRMSNorm: x / sqrt(mean(x^2) + eps) * weight, computed in float32."""

    def __init__(self, d_model, eps=EPS):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def repeat_kv(x, n_rep):
    """(B, KV, T, D) -> (B, KV * n_rep, T, D): query head h reads key/value head h // n_rep."""
    if n_rep == 1:
        return x
    b, kv, t, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, t, d).reshape(b, kv * n_rep, t, d)


class LlamaAttention(nn.Module):
    """Pre-Norm y = x + w_o(Attn(RMSNorm(x))) with grouped-query heads and RoPE on q and k."""

    def __init__(self, d_model, num_heads, num_kv_heads):
        super().__init__()
        assert d_model % num_heads == 0 and num_heads % num_kv_heads == 0
        self.h, self.kv = num_heads, num_kv_heads
        d = d_model // num_heads
        self.w_q = nn.Linear(d_model, num_heads * d, bias=False)
        self.w_k = nn.Linear(d_model, num_kv_heads * d, bias=False)
        self.w_v = nn.Linear(d_model, num_kv_heads * d, bias=False)
        self.w_o = nn.Linear(num_heads * d, d_model, bias=False)
        self.norm = RMSNorm(d_model)
        self.attn_dropout = nn.Dropout(DROPOUT)
        self.qkv = None  # fuse_qkv() sets it

    def forward(self, x, blocked, cos, sin):
        b, t, c = x.shape
        d = c // self.h
        inp = self.norm(x)
        if self.qkv is not None:  # one (C, (H + 2 KV) D) product, split
            q, k, v = self.qkv(inp).split((self.h * d, self.kv * d, self.kv * d), dim=-1)
        else:
            q, k, v = self.w_q(inp), self.w_k(inp), self.w_v(inp)
        q = q.reshape(b, t, self.h, d).transpose(1, 2)  # (B, H, T, D)
        k = k.reshape(b, t, self.kv, d).transpose(1, 2)  # (B, KV, T, D)
        v = v.reshape(b, t, self.kv, d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin  # cos, sin: (T, D)
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, self.h // self.kv), repeat_kv(v, self.h // self.kv)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d))  # (B, H, T, S)
        scores = scores.masked_fill(blocked, float("-inf"))
        weights = F.softmax(scores, dim=-1)
        attended = self.attn_dropout(weights)
        context = torch.matmul(attended, v).transpose(1, 2).reshape(b, t, c)  # (B, H, T, D) -> (B, T, C)
        return x + self.w_o(context)


class GatedFeedForward(nn.Module):
    """LlamaMLP with dropout on the gated hidden: linear2(dropout(silu(gate(x)) * linear1(x)))."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.linear1 = nn.Linear(d_model, d_ff, bias=False)  # the "up" projection
        self.linear2 = nn.Linear(d_ff, d_model, bias=False)  # "down"
        self.dropout = nn.Dropout(DROPOUT)
        self.norm = RMSNorm(d_model)  # the residual connection's, applied by the block

    def forward(self, x):
        return self.linear2(self.dropout(F.silu(self.gate(x)) * self.linear1(x)))


class LlamaBlock(nn.Module):
    def __init__(self, d_model, num_heads, num_kv_heads, d_ff):
        super().__init__()
        self.attn = LlamaAttention(d_model, num_heads, num_kv_heads)
        self.ffn = GatedFeedForward(d_model, d_ff)

    def forward(self, x, blocked, cos, sin):
        h = self.attn(x, blocked, cos, sin)
        return h + self.ffn(self.ffn.norm(h))


class LlamaLanguageModel(nn.Module):
    """h = tok_emb(ids); causal Pre-Norm Llama blocks; final_norm (RMSNorm); head (no bias)."""

    def __init__(self, vocab, d_model, num_heads, num_kv_heads, num_layers, d_ff, max_len):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList([LlamaBlock(d_model, num_heads, num_kv_heads, d_ff) for _ in range(num_layers)])
        self.final_norm = RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        # Hugging Face's LlamaRotaryEmbedding tables, built once: inv_freq_i = theta^(-2i / D), and
        # channel i pairs with i + D/2, so both halves of each row carry the same angles.
        d = d_model // num_heads
        inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)  # (max_len, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (max_len, D)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        gpt2_init(self, num_layers)

    def forward(self, ids):
        t = ids.shape[1]
        h = self.tok_emb(ids)  # (B, T, C)
        blocked = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)  # (T, S), true = key after query
        cos, sin = self.cos[:t], self.sin[:t]
        for block in self.blocks:
            h = block(h, blocked, cos, sin)
        return self.head(self.final_norm(h))  # (B, T, V)


def fuse_qkv(model):
    """Replaces every attention's w_q, w_k and w_v with one Linear `qkv` whose weight (and bias)
    is theirs concatenated by rows, so the fused model computes the same function from the same
    initial weights (and the same seed gives the same first loss in both formulations)."""
    for module in model.modules():
        if isinstance(module, (MultiHeadAttention, LlamaAttention)):
            parts = (module.w_q, module.w_k, module.w_v)
            bias = parts[0].bias is not None
            # skip_init: no random draws, so the dropout masks that follow are the same as well
            fused = torch.nn.utils.skip_init(nn.Linear, parts[0].in_features, sum(p.out_features for p in parts),
                                             bias=bias)
            with torch.no_grad():
                fused.weight.copy_(torch.cat([p.weight for p in parts], dim=0))
                if bias:
                    fused.bias.copy_(torch.cat([p.bias for p in parts], dim=0))
            del module.w_q, module.w_k, module.w_v
            module.qkv = fused


# ---- the benchmark ----

def loaded_openblas():
    """The OpenBLAS that torch loaded (found in /proc/self/maps, so it is the very library torch
    calls), or None. Debian's torch runs its float32 matmuls in the system OpenBLAS (the pthread
    build); libblas.so.3 is a thin wrapper around it, so there is one OpenBLAS in the process."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libopenblas" in line and line.split()[-1].startswith("/")}
    except OSError:
        paths = set()
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        except OSError:
            pass
    try:
        return ctypes.CDLL("libopenblas.so.0", mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    except OSError:
        return None  # not loaded by torch


def set_blas_threads(openblas, n):
    """torch.set_num_threads does not reach OpenBLAS: with --threads 1 its GEMMs still ran on
    every core (user + sys time was about 1.8x wall on 2 cores). So set OpenBLAS's own thread
    count as well, at run time (the environment is left as it is). Returns its thread count, or
    None when no OpenBLAS is loaded."""
    if openblas is None:
        return None
    openblas.openblas_set_num_threads(ctypes.c_int(n))
    return openblas.openblas_get_num_threads()


def openblas_corename(openblas):
    """The kernel OpenBLAS chose at load time (DYNAMIC_ARCH: from the CPU, or OPENBLAS_CORETYPE
    when the environment sets it), e.g. "Cooperlake" or "Haswell"; None without OpenBLAS."""
    if openblas is None:
        return None
    openblas.openblas_get_corename.restype = ctypes.c_char_p
    return openblas.openblas_get_corename().decode()


def gemm_peak(dtype, n=512, reps=50):
    """The best GFLOP/s of an n x n x n torch.matmul in dtype over reps repetitions, at the
    process's thread settings: float32 runs in OpenBLAS, bfloat16 in oneDNN (mkldnn), which is
    where the step's products in that precision run."""
    gen = torch.Generator().manual_seed(1)
    a = (torch.rand(n, n, generator=gen) * 2 - 1).to(dtype)
    b = (torch.rand(n, n, generator=gen) * 2 - 1).to(dtype)
    best = 0.0
    for _ in range(reps):  # a busy neighbour can only slow a repetition down
        start = time.perf_counter()
        torch.matmul(a, b)
        best = max(best, 2.0 * n ** 3 / (time.perf_counter() - start) / 1e9)
    return best


def step_flops(vocab, c, heads, layers, f, t, b, kv_heads=None):
    """Matmul FLOPs of forward + backward (3x the forward): per layer the Q, K, V, O projections
    (K and V of width KV D with grouped-query heads), the attention scores and weighted sum (full
    T x T, the causal mask saves nothing here) and the FFN (three projections when gated); plus
    the head. The same count as bench/train_step.cpp's."""
    kv_width = kv_heads * (c // heads) if kv_heads else c
    ffn_products = 3 if kv_heads else 2
    per_layer = (2 * 2 * b * t * c * c + 2 * 2 * b * t * c * kv_width + 2 * 2 * b * t * t * c
                 + ffn_products * 2 * b * t * c * f)
    forward = layers * per_layer + 2 * b * t * c * vocab
    return 3 * forward


def run(config, steps, warmup, seed, precision="fp32", formulation="separate", record_loss=False):
    vocab, c, heads, layers, f, t, b = CONFIGS[config]
    torch.manual_seed(seed)  # weights and dropout masks
    if config in KV_HEADS:
        model = LlamaLanguageModel(vocab, c, heads, KV_HEADS[config], layers, f, t)
    else:
        model = LanguageModel(vocab, c, heads, layers, f, t, config in GPT2)  # max_len = T, as bench/train_step.cpp
    if formulation == "fused_qkv":
        fuse_qkv(model)  # the same initial weights as "separate", in one (C, 3C) Linear per block
    model.train()  # dropout active
    opt = torch.optim.AdamW(model.parameters(), lr=LR)  # float32 weights and moments in both precisions
    data_gen = torch.Generator().manual_seed(seed)  # token ids, a stream of their own
    # bf16: PyTorch's CPU mixed precision as its documentation recommends: forward and loss under
    # autocast (the products in bfloat16, the ops autocast keeps in float32 in float32), backward
    # outside it (it follows the forward's dtypes), float32 parameters and optimizer.
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext

    times, losses = [], []
    for i in range(warmup + steps):
        # A fresh random batch every step, drawn outside the timed region (xgrad's benchmark does the same).
        seq = torch.randint(0, vocab, (b, t + 1), generator=data_gen)
        ids, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

        start = time.perf_counter()
        with autocast():
            logits = model(ids)
            loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))  # mean
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start

        if i >= warmup:
            times.append(elapsed)
        if record_loss or i == 0 or i == warmup + steps - 1:
            losses.append(loss.item())
    return times, losses, sum(p.numel() for p in model.parameters())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(CONFIGS), help="model size (one per process)")
    parser.add_argument("--threads", type=int, default=1, help="OpenBLAS threads, which run the GEMMs (default 1)")
    parser.add_argument("--intra-op-threads", type=int, default=1,
                        help="torch's own intra-op threads (default 1: its fastest setting here, see below)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="fp32, or bf16: forward and loss under CPU autocast to bfloat16 (default fp32)")
    parser.add_argument("--formulation", choices=("separate", "fused_qkv"), default="separate",
                        help="q, k and v from three Linears, or from one (C, 3C) Linear split in three "
                             "(default separate: no slower on small and 4%% faster on standard, see the top)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--seed", type=int, default=1234, help="weights, dropout and data (default 1234)")
    parser.add_argument("--check", action="store_true",
                        help="train %d steps on tiny and print the first and last loss to stderr" % CHECK_STEPS)
    args = parser.parse_args()
    if args.threads < 1 or args.intra_op_threads < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--threads, --intra-op-threads and --steps must be positive and --warmup non-negative")
    if args.check and args.config not in (None, "tiny"):
        parser.error("--check runs the tiny configuration")
    if not args.check and args.config is None:
        parser.error("--config is required (unless --check)")

    torch.set_num_interop_threads(1)  # before any parallel work
    # Two cores here: OpenBLAS on 2 threads with torch's own pool at 1 thread was PyTorch's fastest
    # 2-thread setting (small: 437 ms per step, against 715-831 ms with both at 2 and 584-661 ms
    # with torch at 2 and OpenBLAS at 1): the two pools' spinning threads fight over the cores.
    torch.set_num_threads(args.intra_op_threads)
    openblas = loaded_openblas()
    blas_threads = set_blas_threads(openblas, args.threads)
    if blas_threads != args.threads:
        print("warning: OpenBLAS threads %r, wanted %d" % (blas_threads, args.threads), file=sys.stderr)

    if args.check:
        _, losses, _ = run("tiny", CHECK_STEPS, 0, args.seed, args.precision, args.formulation, record_loss=True)
        print("check: tiny, %d steps: first loss %.4f, last loss %.4f (uniform over the vocabulary: %.4f)"
              % (CHECK_STEPS, losses[0], losses[-1], math.log(CONFIGS["tiny"][0])), file=sys.stderr)
        if not losses[-1] < losses[0]:
            print("check: FAILED, the loss did not fall", file=sys.stderr)
            sys.exit(1)
        return

    times, losses, parameters = run(args.config, args.steps, args.warmup, args.seed, args.precision,
                                    args.formulation)
    # The process's resident peak (as xgrad's bench_train_step reports it), read before the GEMM
    # peak below touches anything.
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    vocab, c, heads, layers, f, t, b = CONFIGS[args.config]
    median = statistics.median(times)
    gflops = step_flops(vocab, c, heads, layers, f, t, b, KV_HEADS.get(args.config)) / median / 1e9
    peak = gemm_peak(torch.bfloat16 if args.precision == "bf16" else torch.float32)
    result = {
        "impl": "pytorch",
        "config": args.config,
        "precision": args.precision,
        "formulation": args.formulation,
        "threads": args.threads,
        "intra_op_threads": args.intra_op_threads,
        "parameters": parameters,
        "ms_per_step": round(median * 1e3, 3),
        "tokens_per_s": round(b * t / median, 1),
        "peak_rss_mb": round(peak_rss_mb, 1),
        "gflops": round(gflops, 3),
        "gemm_peak_gflops": round(peak, 1),  # a 512^3 torch.matmul in this precision, best of 50
        "peak_fraction": round(gflops / peak, 4),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "openblas_corename": openblas_corename(openblas),
        # torch 1.13 has no fused attention; a later torch would offer it here
        "scaled_dot_product_attention": hasattr(F, "scaled_dot_product_attention"),
        "torch_version": torch.__version__,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

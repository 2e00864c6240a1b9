"""The step bench/sae.cpp times, in PyTorch: an SAE of d_in x d_sae trained with Adam on rows of
width d_in, ReLU + L1 (weighted by the decoder rows' norms) and TopK (unit decoder rows kept).
Prints one JSON line per architecture, with bench_sae's fields. Run with /usr/bin/python3, with
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (OpenBLAS's own kernel choice, as bench/compare.py
runs PyTorch)."""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train_step import loaded_openblas, openblas_corename, set_blas_threads  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--d-in", type=int, default=256)
    p.add_argument("--d-sae", type=int, default=2048)
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    openblas = loaded_openblas()
    set_blas_threads(openblas, a.threads)
    g = torch.Generator().manual_seed(1)
    pool = torch.randn(8 * a.rows, a.d_in, generator=g)
    for arch in ("relu", "topk"):
        w_dec = torch.randn(a.d_sae, a.d_in, generator=g)
        w_dec *= (1.0 if arch == "topk" else 0.1) / w_dec.norm(dim=1, keepdim=True)
        W_dec = torch.nn.Parameter(w_dec)
        W_enc = torch.nn.Parameter(w_dec.t().clone())
        b_enc = torch.nn.Parameter(torch.zeros(a.d_sae))
        b_dec = torch.nn.Parameter(torch.zeros(a.d_in))
        opt = torch.optim.Adam([W_enc, b_enc, W_dec, b_dec], lr=3e-4)

        def step(i):
            x = pool[(i % 8) * a.rows:((i % 8) + 1) * a.rows]
            pre = (x - b_dec) @ W_enc + b_enc
            if arch == "topk":
                values, indices = pre.topk(a.k, dim=-1)
                f = torch.zeros_like(pre).scatter(-1, indices, values.relu())
            else:
                f = pre.relu()
            recons = f @ W_dec + b_dec
            mse = (recons - x).pow(2).sum(-1).mean()
            loss = mse if arch == "topk" else mse + (f * W_dec.norm(dim=1)).sum(-1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if arch == "topk":
                with torch.no_grad():
                    W_dec.div_(W_dec.norm(dim=1, keepdim=True))
            return mse.item()

        for i in range(3):
            step(i)
        start = time.perf_counter()
        for i in range(a.steps):
            mse = step(i)
        ms = 1e3 * (time.perf_counter() - start) / a.steps
        print(json.dumps({"framework": "pytorch " + torch.__version__, "architecture": arch, "d_in": a.d_in,
                          "d_sae": a.d_sae, "rows": a.rows, "k": a.k if arch == "topk" else 0,
                          "threads": a.threads, "ms_per_step": ms, "final_mse": mse,
                          "openblas_corename": openblas_corename(openblas)}))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Runs xgrad's and PyTorch's train-step benchmarks side by side and prints the ratios.

Each configuration runs in its own process (so peak memory is per configuration), xgrad and
PyTorch alternating, in `--repeats` rounds that each run every configuration once; the table
quotes medians, and `paired` is the median over the rounds of each round's xgrad-over-PyTorch
tokens/s (the two ran one after the other, so a change of load moves it least). The machines are
shared and noisy: only ratios measured in one run mean anything.

    /usr/bin/python3 bench/compare.py --threads 1 2 --repeats 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()
    return json.loads(out[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+",
                    default=["tiny", "small", "standard", "long", "llama_small", "llama_standard"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--xgrad", default=os.path.join(ROOT, "build", "bench", "bench_train_step"))
    ap.add_argument("--json", help="also write every measurement here")
    args = ap.parse_args()

    rows, raw = [], []
    for threads in args.threads:
        # Each repeat runs every configuration once, so a change of the machine's load falls on all
        # of them, and configurations compare within the run as the two implementations do.
        x, t = {c: [] for c in args.configs}, {c: [] for c in args.configs}
        for _ in range(args.repeats):
            for config in args.configs:
                x[config].append(run([args.xgrad, "--config", config, "--threads", str(threads),
                                      "--steps", str(args.steps)]))
                t[config].append(run([sys.executable, os.path.join(HERE, "torch_train_step.py"), "--config", config,
                                      "--threads", str(threads), "--steps", str(args.steps)]))
                print(f"  {config} threads {threads}: xgrad {x[config][-1]['ms_per_step']:.1f} ms, "
                      f"pytorch {t[config][-1]['ms_per_step']:.1f} ms", file=sys.stderr)
        for config in args.configs:
            xs, ts = x[config], t[config]
            raw += xs + ts
            med = lambda runs, key: statistics.median(r[key] for r in runs)
            rows.append((config, threads, med(xs, "ms_per_step"), med(ts, "ms_per_step"), med(xs, "tokens_per_s"),
                         med(ts, "tokens_per_s"), med(xs, "peak_rss_mb"), med(ts, "peak_rss_mb"), med(xs, "gflops"),
                         med(xs, "peak_fraction"),
                         statistics.median(a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(xs, ts))))

    print(f"{'config':14} {'threads':>7} {'xgrad ms':>9} {'torch ms':>9} {'xgrad tok/s':>12} {'torch tok/s':>12} "
          f"{'speed-up':>8} {'paired':>7} {'xgrad MB':>9} {'torch MB':>9} {'GFLOP/s':>8} {'of peak':>8}")
    for c, th, xm, tm, xt, tt, xr, tr, gf, pf, paired in rows:
        print(f"{c:14} {th:>7} {xm:>9.1f} {tm:>9.1f} {xt:>12.0f} {tt:>12.0f} {xt / tt:>7.2f}x {paired:>6.2f}x "
              f"{xr:>9.0f} {tr:>9.0f} {gf:>8.1f} {pf:>7.0%}")
    # Each implementation against its own 1-thread run, when the run measured both.
    by_key = {(c, th): (xt, tt) for c, th, xm, tm, xt, tt, *rest in rows}
    scaling = [(c, th, xt / by_key[(c, 1)][0], tt / by_key[(c, 1)][1])
               for c, th, xm, tm, xt, tt, *rest in rows if th != 1 and (c, 1) in by_key]
    if scaling:
        print(f"\n{'config':14} {'threads':>7} {'xgrad vs its 1 thread':>22} {'torch vs its 1 thread':>22}")
        for c, th, xs, ts in scaling:
            print(f"{c:14} {th:>7} {xs:>21.2f}x {ts:>21.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Data-parallel scaling on one machine: xgrad's train step as one process on one thread, one
process on two threads, and two MPI ranks of one thread each (the global batch split between
them), the three alternating `--repeats` times; the table quotes medians and each setting's
tokens/s against one process on one thread, measured in the same run.

    /usr/bin/python3 bench/data_parallel.py --repeats 5 --steps 10
"""
import argparse
import json
import os
import statistics
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()
    return json.loads(out[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["small", "standard"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "bench_train_step"))
    args = ap.parse_args()

    settings = [("1 process, 1 thread", lambda a: [args.bench, "--threads", "1"] + a),
                ("1 process, 2 threads", lambda a: [args.bench, "--threads", "2"] + a),
                ("2 ranks, 1 thread each", lambda a: MPIRUN + ["-np", "2", args.bench, "--threads", "1"] + a)]
    print(f"{'config':9} {'setting':24} {'ms/step':>8} {'tokens/s':>9} {'vs 1x1':>7} {'wait ms':>8} "
          f"{'span ms':>8} {'MB/step':>8}")
    for config in args.configs:
        got = {name: [] for name, _ in settings}
        for _ in range(args.repeats):
            for name, cmd in settings:
                got[name].append(run(cmd(["--config", config, "--steps", str(args.steps)])))
        base = statistics.median(r["tokens_per_s"] for r in got[settings[0][0]])
        for name, _ in settings:
            rs = got[name]
            tps = statistics.median(r["tokens_per_s"] for r in rs)
            ms = statistics.median(r["ms_per_step"] for r in rs)
            if "allreduce_wait_ms_per_step" in rs[0]:
                wait = f"{statistics.median(r['allreduce_wait_ms_per_step'] for r in rs):8.1f}"
                span = f"{statistics.median(r['allreduce_span_ms_per_step'] for r in rs):8.1f}"
                mb = f"{rs[0]['allreduce_bytes_per_step'] / 2**20:8.2f}"
            else:
                wait = span = mb = f"{'-':>8}"
            print(f"{config:9} {name:24} {ms:8.1f} {tps:9.0f} {tps / base:6.2f}x {wait} {span} {mb}")


if __name__ == "__main__":
    main()

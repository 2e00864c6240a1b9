#!/usr/bin/python3
"""Runs xgrad's and PyTorch's train-step benchmarks side by side, in float32 and in bfloat16, and
prints the ratios.

Each configuration runs in its own process (so peak memory is per configuration), in `--repeats`
rounds that each run every configuration once, and within a configuration xgrad fp32, PyTorch
fp32, xgrad bf16 and PyTorch bf16 one after the other. The table quotes medians; the ratios are
`paired`: the median over the rounds of each round's ratio (the two ran one after the other, so a
change of load moves it least). The machines are shared and noisy: only ratios measured in one
run mean anything.

xgrad's bf16 is `bench_train_step --precision bf16`; a bench_train_step without that flag (it
exits 2 naming it) gets "n/a" in the bf16 columns. PyTorch's bf16 is torch_train_step.py
`--precision bf16` (CPU autocast). PyTorch runs with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
removed from its environment, so its OpenBLAS picks its own kernel for this CPU (the table says
which; `--keep-openblas-env` passes them on); xgrad gets the environment as it is.

`of peak` divides a step's matmul GFLOP/s by its precision's peak at the same thread count: the
best 512^3 GEMM of that precision that either process measured (xgrad's fastest engine's sgemm or
PyTorch's torch.matmul for fp32; PyTorch's bfloat16 torch.matmul or xgrad's 512^3 bf16 product,
which its bf16 line reports, for bf16: at two threads that is xgrad's, since PyTorch's intra-op
pool stays at one thread).

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
CONFIGS = ["tiny", "small", "standard", "long", "long4k", "llama_small", "llama_standard", "gpt2_124m"]
DEFAULT_CONFIGS = CONFIGS[:-1]  # gpt2_124m on request: a PyTorch step there takes seconds
SLOW_CONFIGS = ("long4k", "gpt2_124m")
OPENBLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def run(cmd, env=None, cpu=None):
    """The last stdout line of cmd as JSON, cmd pinned to `cpu` when given; raises
    CalledProcessError when cmd fails."""
    pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=pin)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd, proc.stdout, proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def med(runs, key):
    values = [r[key] for r in runs if r is not None and r.get(key) is not None]
    return statistics.median(values) if values else None


def paired(a_runs, b_runs):
    ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(a_runs, b_runs) if a is not None and b is not None]
    return statistics.median(ratios) if ratios else None


def fmt(value, spec, width):
    return f"{'n/a':>{width}}" if value is None else f"{value:>{width}{spec}}"


def ratio(value, width):
    return f"{'n/a':>{width}}" if value is None else f"{value:>{width - 1}.2f}x"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", choices=CONFIGS, default=DEFAULT_CONFIGS)
    ap.add_argument("--threads", nargs="+", type=int, default=[1])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run (default 10)")
    ap.add_argument("--long4k-steps", type=int, default=3,
                    help="timed steps of long4k and gpt2_124m, after 1 warm-up step (default 3: a PyTorch "
                         "step takes seconds)")
    ap.add_argument("--precisions", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    ap.add_argument("--keep-openblas-env", action="store_true",
                    help="pass OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE on to PyTorch as well")
    ap.add_argument("--torch-intra-op-threads", type=int, default=1,
                    help="torch's own intra-op threads in every PyTorch run (default 1)")
    ap.add_argument("--pin-one-thread", type=int, metavar="CPU",
                    help="run every one-thread run of both programs on this CPU (see docs/speed.md: on the "
                         "2-vCPU machines one vCPU can be up to a quarter slower than the other for minutes)")
    ap.add_argument("--xgrad", default=os.path.join(ROOT, "build", "bench", "bench_train_step"))
    ap.add_argument("--json", help="also write every measurement here")
    args = ap.parse_args()

    torch_env = dict(os.environ)
    removed = []
    if not args.keep_openblas_env:
        removed = [f"{k}={torch_env.pop(k)}" for k in OPENBLAS_ENV if k in torch_env]
    xgrad_bf16 = "bf16" in args.precisions  # until bench_train_step rejects --precision
    raw, rows, kernels = [], [], set()

    if args.pin_one_thread is not None and args.pin_one_thread not in os.sched_getaffinity(0):
        sys.exit(f"compare.py: --pin-one-thread {args.pin_one_thread}: not a CPU this process may run on "
                 f"({sorted(os.sched_getaffinity(0))})")

    def pinned(threads):
        return args.pin_one_thread if threads == 1 else None

    def steps_for(config):
        return (args.long4k_steps, 1) if config in SLOW_CONFIGS else (args.steps, 3)

    def xgrad_run(config, threads, precision):
        nonlocal xgrad_bf16
        steps, warmup = steps_for(config)
        cmd = [args.xgrad, "--config", config, "--threads", str(threads), "--steps", str(steps), "--warmup", str(warmup)]
        if precision == "bf16":
            if not xgrad_bf16:
                return None
            cmd += ["--precision", "bf16"]
        try:
            r = run(cmd, cpu=pinned(threads))
        except subprocess.CalledProcessError as e:
            if precision == "bf16" and e.returncode == 2 and "--precision" in e.stderr:
                print(f"xgrad: {args.xgrad} has no --precision: xgrad bf16 is n/a", file=sys.stderr)
                xgrad_bf16 = False
                return None
            print(f"xgrad {config} {precision} threads {threads} failed ({e.returncode}): {e.stderr.strip()}",
                  file=sys.stderr)
            return None
        if precision == "bf16" and r.get("precision") != "bf16":
            print(f"xgrad: --precision bf16 ran {r.get('precision', 'no stated precision')}: n/a", file=sys.stderr)
            xgrad_bf16 = False
            return None
        r.setdefault("precision", precision)
        return r

    def torch_run(config, threads, precision):
        steps, warmup = steps_for(config)
        # torch's own pool stays at --torch-intra-op-threads (1). bf16's products run in oneDNN on
        # that pool, not on OpenBLAS's threads, but 2 intra-op threads made a 2-thread bf16 small
        # step 2 to 5 times slower on the loaded 2-core machine (2.4-4.2 s against 0.9-1.1 s).
        intra = args.torch_intra_op_threads
        cmd = [sys.executable, os.path.join(HERE, "torch_train_step.py"), "--config", config, "--threads",
               str(threads), "--intra-op-threads", str(intra), "--steps", str(steps), "--warmup", str(warmup),
               "--precision", precision]
        try:
            r = run(cmd, env=torch_env, cpu=pinned(threads))
        except subprocess.CalledProcessError as e:
            print(f"pytorch {config} {precision} threads {threads} failed ({e.returncode}): {e.stderr.strip()}",
                  file=sys.stderr)
            return None
        kernels.add(r.get("openblas_corename"))
        return r

    for threads in args.threads:
        # Each repeat runs every configuration once, so a change of the machine's load falls on all
        # of them, and configurations compare within the run as the two implementations do.
        m = {(c, impl, p): [] for c in args.configs for impl in ("xgrad", "pytorch") for p in args.precisions}
        for _ in range(args.repeats):
            for config in args.configs:
                for p in args.precisions:
                    m[(config, "xgrad", p)].append(xgrad_run(config, threads, p))
                    m[(config, "pytorch", p)].append(torch_run(config, threads, p))
                    x, t = m[(config, "xgrad", p)][-1], m[(config, "pytorch", p)][-1]
                    print(f"  {config} {p} threads {threads}: xgrad {fmt(x and x['ms_per_step'], '.1f', 0)} ms, "
                          f"pytorch {fmt(t and t['ms_per_step'], '.1f', 0)} ms", file=sys.stderr)
        raw += [r for runs in m.values() for r in runs if r is not None]
        get = lambda c, impl, p: m.get((c, impl, p), [])
        # The machine's peak per precision at this thread count, as the processes measured it.
        peaks = {}
        for p in args.precisions:
            candidates = [med(get(c, impl, p), "gemm_peak_gflops") for c in args.configs for impl in ("xgrad", "pytorch")]
            candidates = [v for v in candidates if v is not None]
            peaks[p] = max(candidates) if candidates else None
        for c in args.configs:
            row = {"config": c, "threads": threads, "peaks": peaks}
            for impl in ("xgrad", "pytorch"):
                for p in args.precisions:
                    runs = get(c, impl, p)
                    gf = med(runs, "gflops")
                    row[impl, p] = {"tok": med(runs, "tokens_per_s"), "mb": med(runs, "peak_rss_mb"),
                                    "of_peak": gf / peaks[p] if gf is not None and peaks[p] else None}
            row["x/t fp32"] = paired(get(c, "xgrad", "fp32"), get(c, "pytorch", "fp32"))
            row["x/t bf16"] = paired(get(c, "xgrad", "bf16"), get(c, "pytorch", "bf16"))
            row["x bf16/fp32"] = paired(get(c, "xgrad", "bf16"), get(c, "xgrad", "fp32"))
            rows.append(row)

    env_note = f" ({' and '.join(removed)} removed for it)" if removed else ""
    print(f"PyTorch's OpenBLAS kernel: {', '.join(sorted(str(k) for k in kernels)) or 'n/a'}{env_note}")
    if args.pin_one_thread is not None:
        print(f"one-thread runs of both programs pinned to CPU {args.pin_one_thread}")
    cell = lambda row, impl, p, key: row.get((impl, p), {}).get(key)
    print(f"{'':14} {'':>7} {'tokens/s':^43} {'xgrad/torch':^15} {'xgrad':>6} {'peak MB fp32/bf16':^21}"
          f" {'of peak':^23}")
    print(f"{'config':14} {'threads':>7} {'xg fp32':>10} {'xg bf16':>10} {'pt fp32':>10} {'pt bf16':>10}"
          f" {'fp32':>7} {'bf16':>7} {'bf/fp':>6} {'xgrad':>10} {'torch':>10}"
          f" {'xg32':>5} {'xg16':>5} {'pt32':>5} {'pt16':>5}")
    for row in rows:
        mb = lambda impl: "/".join(fmt(cell(row, impl, p, "mb"), ".0f", 0) for p in ("fp32", "bf16"))
        print(f"{row['config']:14} {row['threads']:>7}"
              + "".join(" " + fmt(cell(row, impl, p, "tok"), ".0f", 10)
                        for impl, p in (("xgrad", "fp32"), ("xgrad", "bf16"), ("pytorch", "fp32"), ("pytorch", "bf16")))
              + " " + ratio(row["x/t fp32"], 7) + " " + ratio(row["x/t bf16"], 7) + " " + ratio(row["x bf16/fp32"], 6)
              + f" {mb('xgrad'):>10} {mb('pytorch'):>10}"
              + "".join(" " + fmt(cell(row, impl, p, "of_peak"), ".0%", 5)
                        for impl, p in (("xgrad", "fp32"), ("xgrad", "bf16"), ("pytorch", "fp32"), ("pytorch", "bf16"))))
    for threads in args.threads:
        peaks = next(r["peaks"] for r in rows if r["threads"] == threads)
        print(f"peak GFLOP/s at {threads} thread(s): "
              + ", ".join(f"{p} {fmt(v, '.0f', 0)}" for p, v in peaks.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()

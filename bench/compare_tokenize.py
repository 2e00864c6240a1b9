#!/usr/bin/env python3
"""GPT-2 tokenizer encode speed, xgrad (build/bench/bench_tokenize) against js-tiktoken 1.0.21
(bench/tokenize_js.mjs), one thread each. The two programs alternate for --rounds rounds over the
fixture corpus and the licence texts in /usr/share/common-licenses; each round gives each file's
median over --repeats encodes, and the table gives the median of the rounds and the ratio. The two
must also agree on every file's token count.

    NODE_PATH=~/xgrad-node/node_modules python3 bench/compare_tokenize.py [--build build] [--rounds 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LICENCES = ["GPL-3", "Apache-2.0", "GPL-2", "LGPL-2.1", "MPL-2.0"]


def run(command):
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return {r["file"]: r for r in map(json.loads, out.splitlines())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    fixture = os.path.join(ROOT, "tests", "fixtures", "gpt2_tokenizer")
    licences = [os.path.join("/usr/share/common-licenses", name) for name in LICENCES]
    licences = [p for p in licences if os.path.exists(p)]
    with tempfile.TemporaryDirectory() as tmp:
        joined = os.path.join(tmp, "licences-joined.txt")
        with open(joined, "wb") as out:
            for p in licences:
                with open(p, "rb") as f:
                    out.write(f.read())
        files = [os.path.join(fixture, "corpus.txt")] + licences + [joined]
        ours = [os.path.join(args.build, "bench", "bench_tokenize"), "--tokenizer", fixture,
                "--repeats", str(args.repeats), "--json"] + files
        theirs = ["node", os.path.join(ROOT, "bench", "tokenize_js.mjs"), "--repeats", str(args.repeats),
                  "--json"] + files
        rates = {f: {"xgrad": [], "js": []} for f in files}
        results = {}
        for _ in range(args.rounds):
            for name, command in (("xgrad", ours), ("js", theirs)):
                for f, r in run(command).items():
                    rates[f][name].append(r["mb_per_s"])
                    results.setdefault(f, {})[name] = r
        print(f"GPT-2 encode, one thread, MB/s (median of {args.rounds} alternating rounds, "
              f"each the median of {args.repeats} encodes)")
        print(f"| {'text':<28} | {'bytes':>8} | {'tokens':>7} | {'xgrad':>8} | {'js-tiktoken':>11} | {'ratio':>6} |")
        print(f"|{'-' * 30}|{'-' * 9}:|{'-' * 8}:|{'-' * 9}:|{'-' * 12}:|{'-' * 7}:|")
        failed = False
        for f in files:
            a, b = results[f]["xgrad"], results[f]["js"]
            if a["tokens"] != b["tokens"]:
                print(f"{f}: xgrad gives {a['tokens']} tokens, js-tiktoken {b['tokens']}", file=sys.stderr)
                failed = True
            x, j = statistics.median(rates[f]["xgrad"]), statistics.median(rates[f]["js"])
            label = "licences joined" if f == joined else os.path.basename(f)
            print(f"| {label:<28} | {a['bytes']:>8} | {a['tokens']:>7} | {x:>8.2f} | {j:>11.2f} | {x / j:>5.1f}x |")
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

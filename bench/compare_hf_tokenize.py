#!/usr/bin/env python3
"""tokenizer.json encode speed, xgrad (build/bench/bench_tokenize --kind hf) against Hugging Face's
JavaScript tokenizers (bench/tokenizers/hf_js_encode.mjs), one thread each, on English text (the
licence texts in /usr/share/common-licenses, joined). The two programs alternate for --rounds
rounds; each gives the median of --repeats encodes, and the table gives the median of the rounds,
the ratio (the median of the rounds' ratios), and whether xgrad reaches 20 MB/s and 10x. js-tiktoken's o200k is a second reference.

    NODE_PATH=~/hf-node/node_modules python3 bench/compare_hf_tokenize.py [--build build] [--rounds 3] [NAME...]

NAME is a folder under BUILD/tests/hf_tokenizers (unpacked from tests/fixtures/hf_tokenizers).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LICENCES = ["GPL-3", "Apache-2.0", "GPL-2", "LGPL-2.1", "MPL-2.0"]
NAMES = ["llama3", "qwen2_5", "qwen3", "gemma3", "mistral", "o200k", "gpt2", "phi3_shape", "smollm2_shape"]


def xgrad_rate(build, folder, text, repeats):
    out = subprocess.run([os.path.join(build, "bench", "bench_tokenize"), "--kind", "hf", "--tokenizer", folder,
                          "--repeats", str(repeats), "--json", text], check=True, capture_output=True, text=True)
    r = json.loads(out.stdout.splitlines()[0])
    return r["mb_per_s"], r["tokens"]


def js_rate(args, text, repeats):
    out = subprocess.run(["node", os.path.join(ROOT, "bench", "tokenizers", "hf_js_encode.mjs")] + args +
                         [text, str(repeats)], check=True, capture_output=True, text=True).stdout
    m = re.search(r"MB/s=([0-9.]+) tokens=([0-9]+)", out)
    return float(m.group(1)), int(m.group(2))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5, help="JavaScript encodes a round (xgrad: 10 times as many)")
    parser.add_argument("names", nargs="*", default=NAMES)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "licences.txt")
        with open(text, "wb") as out:
            for name in LICENCES:
                path = os.path.join("/usr/share/common-licenses", name)
                if os.path.exists(path):
                    with open(path, "rb") as f:
                        out.write(f.read())
        size = os.path.getsize(text)
        print(f"encode, one thread, {size} bytes of English (licences joined), MB/s: median of {args.rounds} "
              f"alternating rounds, each the median of {10 * args.repeats} encodes (xgrad) or {args.repeats} (JavaScript)")
        print("| tokenizer | xgrad | tokens | Hugging Face JS | tokens | ratio | >= 20 MB/s | >= 10x |")
        print("|---|---:|---:|---:|---:|---:|---|---|")
        for name in args.names:
            folder = os.path.join(args.build, "tests", "hf_tokenizers", name)
            references = [("Hugging Face JS", [folder])]
            if name == "o200k":
                references.append(("js-tiktoken", ["--tiktoken", "o200k_base"]))
            for label, js_args in references:
                ours, theirs, ratios = [], [], []
                for _ in range(args.rounds):
                    x, x_tokens = xgrad_rate(args.build, folder, text, 10 * args.repeats)
                    j, j_tokens = js_rate(js_args, text, args.repeats)
                    ours.append(x)
                    theirs.append(j)
                    ratios.append(x / j)
                x, j, ratio = statistics.median(ours), statistics.median(theirs), statistics.median(ratios)
                print(f"| {name} ({label}) | {x:.2f} | {x_tokens} | {j:.2f} | {j_tokens} | {ratio:.1f}x | "
                      f"{'yes' if x >= 20 else 'no'} | {'yes' if ratio >= 10 else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

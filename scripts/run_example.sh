#!/usr/bin/env bash
# The README's first command: install what is missing, build, run the main example.
# Extra arguments go to the example (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
exec ./build/examples/head_specialization "$@"

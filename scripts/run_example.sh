#!/usr/bin/env bash
# The README's first command: install what is missing, configure build/ in Release, build the
# library and the head-specialization example (only those: run_tests.sh builds the rest), run it.
# Each phase says what it does; the table at the end gives their times. Extra arguments go to
# the example (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/phases.sh
phase "install the missing Debian packages" bash scripts/install_deps.sh
phase "configure build/ (Release)" bash scripts/configure.sh build -DCMAKE_BUILD_TYPE=Release
phase "build the library and the example" cmake --build build -j "$(nproc)" --target head_specialization
phase "run build/examples/head_specialization" ./build/examples/head_specialization "$@"
phase_table

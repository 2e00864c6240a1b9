#!/usr/bin/env bash
# One code style: every C++ file of the library, the examples, the benchmarks and the tests must
# be as clang-format (Debian's clang-format-14, the version of the clang the fuzzer uses) writes
# it under .clang-format. Prints each file that differs and fails; `--fix` rewrites them instead.
# Usage: scripts/check_format.sh [--fix]
set -euo pipefail
cd "$(dirname "$0")/.."
format=clang-format-14  # another version lays some lines out differently
if ! command -v "$format" > /dev/null; then
  echo "check_format: clang-format-14 is not installed (scripts/install_deps.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(find xgrad.hpp core nn optim weights inspect distributed text tools examples bench tests \
                       \( -name '*.cpp' -o -name '*.hpp' \) -not -path 'tests/fuzz_corpus/*' -not -path 'tests/fixtures/*' | sort)
if [ "${1:-}" = --fix ]; then
  "$format" -i "${files[@]}"
  exit 0
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! "$format" --dry-run -Werror "${files[@]}" 2> "$log"; then
  grep -o '^[^:]*:[0-9]*:[0-9]*: error' "$log" | cut -d: -f1 | sort -u | sed 's/^/  not formatted: /' >&2
  echo "check_format: the files above differ from clang-format's layout (scripts/check_format.sh --fix rewrites them)" >&2
  exit 1
fi
echo "check_format: ${#files[@]} C++ files formatted"

#!/usr/bin/env bash
# Builds the libFuzzer target for parse_safetensors with clang (AddressSanitizer and UBSan on)
# and runs it for a bounded time, starting from the committed corpus (copied, so the repository
# is not written to). Exits 77 (skipped) when clang or libFuzzer is not available.
# Usage: run_fuzz.sh SOURCE_DIR WORK_DIR [SECONDS]
set -euo pipefail
src=$1 work=$2 seconds=${3:-20}
if ! command -v clang++ > /dev/null; then
  echo "run_fuzz: clang++ not found, skipped"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work/include" "$work/corpus"
ln -s "$src" "$work/include/xgrad"
flags="-std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DXTENSOR_USE_XSIMD"
if ! clang++ $flags -I "$work/include" "$src/tests/fuzz/fuzz_safetensors.cpp" "$src/core/io/safetensors.cpp" "$src/core/io/file_io.cpp" \
     "$src/core/io/memory.cpp" "$src/core/io/utf8.cpp" "$src/core/autograd/array_allocator.cpp" \
     -o "$work/fuzz_safetensors" 2> "$work/build.log"; then
  if grep -q "fuzzer" "$work/build.log"; then
    echo "run_fuzz: clang cannot build with -fsanitize=fuzzer here, skipped"
    exit 77
  fi
  cat "$work/build.log" >&2
  exit 1
fi
cp "$src"/tests/fuzz_corpus/* "$work/corpus/"
cd "$work"
./fuzz_safetensors -max_total_time="$seconds" -rss_limit_mb=1024 -malloc_limit_mb=512 -max_len=8192 -print_final_stats=1 corpus

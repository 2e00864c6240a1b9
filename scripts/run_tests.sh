#!/usr/bin/env bash
# The README's second command: install what is missing, check the code style and the API
# reference, build, run every test; then build the same suite under AddressSanitizer and
# UndefinedBehaviorSanitizer (build-sanitize/) and run it again there.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
# The cheap checks first: one code style, and an API reference with every public entity documented.
bash scripts/check_format.sh
bash scripts/docs.sh
bash scripts/build.sh
(cd build && ctest --output-on-failure -j "$(nproc)")
# Every test again with each GEMM engine forced (the run above chose per product); a build
# without oneDNN runs the OpenBLAS pass only.
for engine in openblas onednn; do
  if [ "$engine" = onednn ] && ! grep -q "^XGRAD_HAS_ONEDNN:INTERNAL=ON" build/CMakeCache.txt; then
    echo "xgrad: built without oneDNN, no oneDNN pass"
    continue
  fi
  echo "xgrad: the test suite again with XGRAD_GEMM=$engine"
  (cd build && XGRAD_GEMM=$engine ctest --output-on-failure -j "$(nproc)" -E "install_and_readme_tour|fuzz_safetensors")
done

echo "xgrad: a build without oneDNN (OpenBLAS only): the library and the engine tests"
# -O1: this build checks the engine choice, not speed, and compiles in two thirds of the time.
cmake -S . -B build-openblas-only -DXGRAD_WITH_ONEDNN=OFF -DXGRAD_BUILD_EXAMPLES=OFF \
      -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1" > /dev/null
cmake --build build-openblas-only -j "$(nproc)" --target test_gemm_engines test_ops_values
(cd build-openblas-only && ctest --output-on-failure -j "$(nproc)" -R "^test_(gemm_engines|ops_values):|^gemm_engines_")

echo "xgrad: the test suite again under AddressSanitizer and UndefinedBehaviorSanitizer"
sanitize="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"
# -g1 (line tables) is enough for the sanitizers' stack traces and compiles a third faster than
# -g; the benchmarks have no tests and are left out. The test sources compile at -Og, in half the
# time -O1 takes them under the sanitizers (tests/CMakeLists.txt); the library keeps -O1.
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" -DXGRAD_BUILD_BENCH=OFF \
      -DXGRAD_TEST_COMPILE_OPTIONS=-Og -DCMAKE_CXX_FLAGS="$sanitize" -DCMAKE_EXE_LINKER_FLAGS="$sanitize" > /dev/null
cmake --build build-sanitize -j "$(nproc)"
# The install test links an outside project without the sanitizer runtime, and the fuzzer
# already runs under the sanitizers: both run above only.
# Open MPI keeps allocations until exit that LeakSanitizer would report: tests/lsan_openmpi.supp
# names its libraries, and nothing else.
suppressions="$PWD/tests/lsan_openmpi.supp"
(cd build-sanitize && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
   LSAN_OPTIONS="suppressions=$suppressions" \
   ctest --output-on-failure -j "$(nproc)" -E "install_and_readme_tour|fuzz_safetensors")

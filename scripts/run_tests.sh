#!/usr/bin/env bash
# The README's second command, and CI's: install what is missing, check the code style and the API
# reference, build everything in Release and run every test (among them the engine tests on the
# library built without oneDNN); run the tests whose results depend on the GEMM engine again with
# each engine forced; build the suite under AddressSanitizer and UndefinedBehaviorSanitizer and run
# every test again. Each phase says what it does; the table at the end gives their times (and names
# the phase that failed, if one did).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/phases.sh
jobs=$(nproc)

# Each ctest pass's summary line is kept, and the sum of all passes ends the output.
ctest_totals=$(mktemp)
trap 'end_beside; rm -f "$ctest_totals"' EXIT
run_ctest() {
  local dir=$1
  shift
  local log="$dir/ctest-last.log"
  (cd "$dir" && ctest --output-on-failure -j "$jobs" "$@") | tee "$log"
  grep -E '^[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' "$log" | tail -1 >> "$ctest_totals"
}

# The test sources compile at -Og in the Release build (the library, the examples and the kernel
# copies keep -O3): 2.8x faster to compile than -O3 (tests/test_checkpoint.cpp: 21.2 s at -O3,
# 9.9 at -O1, 7.5 at -Og), and the library under test is what the Release build is for.
release_options=(-DCMAKE_BUILD_TYPE=Release -DXGRAD_TEST_COMPILE_OPTIONS=-Og)

# Every test again with each GEMM engine forced (the first pass chose per product): the tests
# labelled gemm, which are every test that reads the engine choice or starts a program
# (tests/CMakeLists.txt says how the label is kept honest). A build without oneDNN runs the
# OpenBLAS pass only.
forced_engine_pass() {
  local engine=$1
  if [ "$engine" = onednn ] && ! grep -q "^XGRAD_HAS_ONEDNN:INTERNAL=ON" build/CMakeCache.txt; then
    echo "xgrad: built without oneDNN, no oneDNN pass"
    return 0
  fi
  XGRAD_GEMM=$engine run_ctest build -L '^gemm$'
}

# The sanitizer build: no debug information (-g0), so the sanitizers' stack traces name functions
# without their lines; -g1 (line tables) cost 27% more compile time (tests/test_ops_values.cpp:
# 16.1 s against 11.8), and a failure is rebuilt with it to read its lines. The benchmarks have no
# tests and are left out. The test sources compile at -Og, in half the time -O1 takes them under
# the sanitizers; the examples and tools too (examples/train_lm/trainer.cpp: 23.9 s at -O1, 15.5 at
# -Og); the library keeps -O1 (at -Og the sanitizer pass took 708 s instead of 332). Two options
# make less code for the same checks: no stack frames set up for use-after-return detection, which
# the runtime leaves off unless ASAN_OPTIONS asks for it (the passes do not), and, outside the
# library, AddressSanitizer's checks as calls rather than inline code. The test sources took 594
# CPU-seconds instead of 783 and the whole build 1432 instead of 1599; the pass took as long.
sanitize="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"
outside_library="-Og;--param=asan-instrumentation-with-call-threshold=0"
configure_sanitize() {
  bash scripts/configure.sh build-sanitize -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g0" \
    -DXGRAD_BUILD_BENCH=OFF -DXGRAD_TEST_COMPILE_OPTIONS="$outside_library" \
    -DXGRAD_PROGRAM_COMPILE_OPTIONS="$outside_library" -DCMAKE_CXX_FLAGS="$sanitize --param=asan-use-after-return=0" \
    -DCMAKE_EXE_LINKER_FLAGS="$sanitize"
}
# The install test links an outside project without the sanitizer runtime, and the fuzzer already
# runs under the sanitizers: both run in the first pass only. Open MPI keeps allocations until exit
# that LeakSanitizer would report: tests/lsan_openmpi.supp names its libraries, and nothing else.
sanitize_pass() {
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    LSAN_OPTIONS="suppressions=$PWD/tests/lsan_openmpi.supp" \
    run_ctest build-sanitize -E "install_and_readme_tour|fuzz_safetensors"
}

phase "install the missing Debian packages" bash scripts/install_deps.sh
phase "code style (clang-format)" bash scripts/check_format.sh
phase "API reference (doxygen)" bash scripts/docs.sh
phase "configure build/ (Release)" bash scripts/configure.sh build "${release_options[@]}"
phase "build everything (Release)" cmake --build build -j "$jobs"
# The Release passes leave part of the two cores idle (tests that wait, the last tests of a pass):
# the sanitizer build runs beside them and takes that part (scripts/phases.sh says how).
phase "configure build-sanitize/ (ASan + UBSan)" configure_sanitize
phase_beside "build under the sanitizers" build-sanitize/build.log cmake --build build-sanitize -j "$jobs"
phase "every test (engine chosen per product)" run_ctest build
phase "gemm-labelled tests, XGRAD_GEMM=openblas" forced_engine_pass openblas
phase "gemm-labelled tests, XGRAD_GEMM=onednn" forced_engine_pass onednn
phase_join
phase "every test under the sanitizers" sanitize_pass
phase_table
# The passes' totals: "N passed, N failed", as the last line.
awk '{failed += $4; total += $9} END {printf "tests: %d passed, %d failed\n", total - failed, failed}' "$ctest_totals"

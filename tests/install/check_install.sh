#!/usr/bin/env bash
# Installs xgrad from a build tree into a scratch prefix, then builds and runs the README's tour
# (a first model, which must write back the phrase it learned) and a program on xgrad::text (the
# tokenizers) as an outside project with
# find_package(xgrad); then the same against the build tree itself (xgrad_DIR=BUILD_DIR). Where
# MPI is installed, both also ask for the distributed component (find_package(xgrad REQUIRED
# COMPONENTS distributed)) and run its program alone and on two ranks: a component that does not
# configure, build or run fails the check. Only without MPI is it skipped.
# Usage: check_install.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
build=$1 src=$2 work=$3
rm -rf "$work"
mkdir -p "$work/consumer"
cmake --install "$build" --prefix "$work/prefix" > /dev/null
# Only the public headers are installed: nothing from a detail/ folder (the library's internals).
internal=$(find "$work/prefix/include/xgrad" -path '*/detail/*' -o -name detail)
if [ -n "$internal" ]; then
  echo "check_install: internal headers were installed: $internal" >&2
  exit 1
fi
[ -f "$work/prefix/include/xgrad/core/autograd/tensor.hpp" ] || { echo "check_install: core/autograd/tensor.hpp is not installed" >&2; exit 1; }
# ... and every xgrad header an installed header includes is installed too.
while read -r header included; do
  if [ ! -f "$work/prefix/include/$included" ]; then
    echo "check_install: the installed ${header#$work/prefix/include/} includes $included, which is not installed" >&2
    exit 1
  fi
done < <(grep -rHo '^#include "xgrad/[^"]*"' "$work/prefix/include/xgrad" | sed 's/:#include "/ /; s/"$//')

# The tour is the ```cpp block between the README's "tour: begin" and "tour: end" markers.
awk '/<!-- tour: begin -->/{on=1; next} /<!-- tour: end -->/{on=0} on && /^```cpp/{code=1; next}
     on && /^```/{code=0} code' "$src/README.md" > "$work/consumer/tour.cpp"
if [ ! -s "$work/consumer/tour.cpp" ]; then
  echo "check_install: no tour code found in README.md" >&2
  exit 1
fi
cp "$src/tests/install/CMakeLists.txt" "$src/tests/install/data_parallel.cpp" "$src/tests/install/text_tokens.cpp" "$work/consumer/"

# MPI is installed when the build found its library or its compiler wrapper is on PATH (the
# development files; mpirun alone is not enough to build against).
distributed=OFF
if grep -q '^MPI_mpi_LIBRARY:FILEPATH=/' "$build/CMakeCache.txt" 2>/dev/null || command -v mpicxx > /dev/null; then
  distributed=ON
else
  echo "check_install: no MPI here (no MPI library in the build, no mpicxx): the distributed component is not checked"
fi
mpirun_cmd=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2)

# consumer BUILD_FOLDER CMAKE_ARGS...: configures and builds the consumer, runs the tour and,
# with the component, the data-parallel program alone and on two ranks.
consumer() {
  local out=$1
  shift
  if ! cmake -S "$work/consumer" -B "$out" -DCMAKE_BUILD_TYPE=Release -DWITH_DISTRIBUTED=$distributed "$@" > "$out.configure.log" 2>&1; then
    cat "$out.configure.log" >&2
    echo "check_install: the consumer in $out does not configure" >&2
    exit 1
  fi
  cmake --build "$out" > "$out.build.log" 2>&1 || { cat "$out.build.log" >&2; echo "check_install: the consumer in $out does not build" >&2; exit 1; }
  "$out/tour" > "$out.tour.out"
  grep -q "sample: hello world hello world" "$out.tour.out"
  "$out/text_tokens" | tee "$out.text.out"
  grep -q "text: 5 pieces, 20 byte tokens" "$out.text.out"
  if [ "$distributed" = ON ]; then
    "$out/data_parallel" | tee "$out.dp1.out"
    grep -q "data-parallel gradient agrees on 1 process(es)" "$out.dp1.out"
    "${mpirun_cmd[@]}" "$out/data_parallel" | tee "$out.dp2.out"
    grep -q "data-parallel gradient agrees on 2 process(es)" "$out.dp2.out"
  fi
}
consumer "$work/consumer/build" -DCMAKE_PREFIX_PATH="$work/prefix"
cat "$work/consumer/build.tour.out"
# The build tree as the package, without installing.
consumer "$work/from_build" -Dxgrad_DIR="$build"
echo "install check: passed (distributed component: $distributed)"

#!/usr/bin/env bash
# Installs xgrad from a build tree into a scratch prefix, then builds and runs the README's API
# tour as an outside project with find_package(xgrad); then the same against the build tree
# itself (xgrad_DIR=BUILD_DIR).
# Usage: check_install.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
build=$1 src=$2 work=$3
rm -rf "$work"
mkdir -p "$work/consumer"
cmake --install "$build" --prefix "$work/prefix" > /dev/null

# The tour is the ```cpp block between the README's "tour: begin" and "tour: end" markers.
awk '/<!-- tour: begin -->/{on=1; next} /<!-- tour: end -->/{on=0} on && /^```cpp/{code=1; next}
     on && /^```/{code=0} code' "$src/README.md" > "$work/consumer/tour.cpp"
if [ ! -s "$work/consumer/tour.cpp" ]; then
  echo "check_install: no tour code found in README.md" >&2
  exit 1
fi
cp "$src/tests/install/CMakeLists.txt" "$src/tests/install/data_parallel.cpp" "$work/consumer/"
cmake -S "$work/consumer" -B "$work/consumer/build" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$work/prefix" > /dev/null
cmake --build "$work/consumer/build" > /dev/null
"$work/consumer/build/tour" | tee "$work/tour.out"
grep -q "tensors agree" "$work/tour.out"
# The distributed component, when xgrad was built with it: alone, and on two ranks.
if [ -x "$work/consumer/build/data_parallel" ]; then
  "$work/consumer/build/data_parallel"
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$work/consumer/build/data_parallel"
fi
# The build tree as the package, without installing.
cmake -S "$work/consumer" -B "$work/from_build" -DCMAKE_BUILD_TYPE=Release -Dxgrad_DIR="$build" > /dev/null
cmake --build "$work/from_build" > /dev/null
"$work/from_build/tour" > "$work/tour_from_build.out"
grep -q "tensors agree" "$work/tour_from_build.out"
echo "install check: passed"

#!/usr/bin/env bash
# Installs xgrad from a build tree into a scratch prefix, checks the installed programs (train_lm,
# xgrad-tokenize, xgrad_to_torch.py) and that every library is a component of the package (a
# missing one named with the reason), then builds and runs the README's tour
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
# The programs a user runs are installed (when the examples were built), and run from there.
if [ -e "$build/examples/train_lm" ]; then
  for program in train_lm xgrad-tokenize xgrad_to_torch.py; do
    [ -x "$work/prefix/bin/$program" ] || { echo "check_install: bin/$program is not installed" >&2; exit 1; }
  done
  help=$("$work/prefix/bin/train_lm" --help)
  grep -qF -- "--tokenizer KIND [PATH]" <<< "$help" || { echo "check_install: the installed train_lm --help does not run" >&2; exit 1; }
  [ "$("$work/prefix/bin/xgrad-tokenize" ids --tokenizer bytes "hi")" = "[104,105]" ] ||
    { echo "check_install: the installed xgrad-tokenize does not run" >&2; exit 1; }
fi

# Every library is a component: core, text and (with MPI) distributed configure when asked for;
# a missing one or an unknown name stops the configure naming it and the reason.
components() {
  local name=$1 list=$2
  shift 2
  cmake -S "$src/tests/install/components" -B "$work/components/$name" -DCMAKE_PREFIX_PATH="$work/prefix" \
    "-DXGRAD_COMPONENTS=$list" "$@" > "$work/components/$name.log" 2>&1
}
mkdir -p "$work/components"
found="core;text"
[ "$distributed" = ON ] && found="core;text;distributed"
components found "$found" || { cat "$work/components/found.log" >&2; echo "check_install: COMPONENTS $found does not configure" >&2; exit 1; }
# not_found NAME LIST MESSAGE [CMAKE_ARGS...]: configuring must fail, saying MESSAGE.
not_found() {
  local name=$1 list=$2 message=$3
  shift 3
  if components "$name" "$list" "$@"; then
    echo "check_install: COMPONENTS $list configured although it should not ($*)" >&2
    exit 1
  fi
  tr -s ' \n' ' ' < "$work/components/$name.log" | grep -qF "$message" || {
    cat "$work/components/$name.log" >&2
    echo "check_install: COMPONENTS $list failed without saying: $message" >&2
    exit 1
  }
}
not_found unknown "text;tokenizers" 'xgrad has no component "tokenizers" (its components: core, text, distributed).'
not_found no_pkg_config "core;text" "The component text (xgrad::text) is missing: it needs pkg-config" \
  -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON
if [ "$distributed" = ON ]; then
  not_found no_mpi "text;distributed" "The component distributed (xgrad::distributed) is missing: it needs MPI's C API" \
    -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON
else
  not_found no_mpi "distributed" "xgrad was built without MPI"
fi
# What is not asked for may be missing.
components core_only "core" -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON || { cat "$work/components/core_only.log" >&2; echo "check_install: COMPONENTS core needs pkg-config" >&2; exit 1; }

consumer "$work/consumer/build" -DCMAKE_PREFIX_PATH="$work/prefix"
cat "$work/consumer/build.tour.out"
# The build tree as the package, without installing.
consumer "$work/from_build" -Dxgrad_DIR="$build"
echo "install check: passed (distributed component: $distributed)"

#!/usr/bin/env bash
# Configures one build folder: cmake -S . -B DIR with the options given, its output kept in
# DIR/configure.log. Prints CMake's own xgrad lines (the engines, MPI) and, when it fails, the log.
# Usage: scripts/configure.sh DIR [CMAKE_OPTION...]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  echo "configure.sh: usage: scripts/configure.sh DIR [CMAKE_OPTION...]" >&2
  exit 2
fi
dir=$1
shift
mkdir -p "$dir"
if ! cmake -S . -B "$dir" "$@" > "$dir/configure.log" 2>&1; then
  cat "$dir/configure.log" >&2
  echo "configure.sh: cmake could not configure $dir (its output is above and in $dir/configure.log)" >&2
  exit 1
fi
grep '^-- xgrad: ' "$dir/configure.log" | sed 's/^-- /  /' || true

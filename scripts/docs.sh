#!/usr/bin/env bash
# The API reference: runs doxygen on docs/Doxyfile over the public headers and writes HTML to
# build/docs/html (or to the folder given). A public entity without documentation is a warning,
# and any warning fails this script (CI runs it).
# Usage: scripts/docs.sh [OUTPUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/docs}
if ! command -v doxygen > /dev/null; then
  echo "docs.sh: doxygen is not installed (scripts/install_deps.sh installs it)" >&2
  exit 1
fi
mkdir -p "$out"
log="$out/warnings.log"
if ! (cat docs/Doxyfile; echo "OUTPUT_DIRECTORY = $out") | doxygen - 2> "$log"; then
  cat "$log" >&2
  echo "docs.sh: doxygen reported $(grep -c . "$log") warning line(s) (above); the reference is not complete" >&2
  exit 1
fi
echo "docs.sh: API reference written to $out/html/index.html"

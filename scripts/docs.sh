#!/usr/bin/env bash
# The API reference: runs doxygen on docs/Doxyfile over the public headers and writes HTML to
# build/docs/html (or to the folder given), with docs/mainpage.md as its first page. The headers
# are read through a temporary folder holding a link named xgrad to the source root, so that the
# pages show includes as users write them: #include <xgrad/nn/transformer.hpp>.
#
# The rule (CI runs this script): it fails on any doxygen warning but one kind, "Member ... is
# not documented" for
#   - a variable (a field, or a constant at namespace level), a typedef or alias, an enum value
#     or a macro, anywhere, and
#   - a member function but the constructor of a struct or class whose name ends in Options (an
#     options struct's accessors; docs/Doxyfile documents those XGRAD_ARG declares in any case).
# So it fails on an undocumented class, struct, union or enum type ("Compound ... is not
# documented", "(enumeration)"), an undocumented function at namespace level, an undocumented
# member function of any other class (constructors and friends too), an undocumented constructor
# of an options struct, and every doc error: an unknown command, a \param that names no
# parameter, a \ref that resolves to nothing. Doxygen does not warn about an undocumented
# namespace (it leaves out the namespace's page, and the functions on it), so a namespace of
# xgrad's that the public headers open without a page fails it too. The warnings left out go to
# warnings-undocumented.log beside the HTML, those that fail it to warnings.log, and every one to
# warnings-all.log.
# Usage: scripts/docs.sh [OUTPUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/docs}
if ! command -v doxygen > /dev/null; then
  echo "docs.sh: doxygen is not installed (scripts/install_deps.sh installs it)" >&2
  exit 1
fi
mkdir -p "$out"
root=$PWD
view=$(mktemp -d)
trap 'rm -rf "$view"' EXIT
ln -s "$root" "$view/xgrad"
src="$view/xgrad"
all="$out/warnings-all.log"
log="$out/warnings.log"
allowed="$out/warnings-undocumented.log"
if ! (
  cat docs/Doxyfile
  echo "OUTPUT_DIRECTORY = \"$out\""
  echo "INPUT = $src/xgrad.hpp $src/core $src/nn $src/optim $src/weights $src/inspect $src/distributed $src/text $src/docs/mainpage.md"
  echo "USE_MDFILE_AS_MAINPAGE = $src/docs/mainpage.md"
  echo "STRIP_FROM_PATH = $view"
  echo "STRIP_FROM_INC_PATH = $view"
) | doxygen - 2> "$all"; then
  cat "$all" >&2
  echo "docs.sh: doxygen failed (above)" >&2
  exit 1
fi
sed -i "s|$src/||" "$all"  # warnings name the headers from the source root
undocumented_member=': warning: Member .* \((variable|typedef|enumvalue|macro definition)\) of .* is not documented\.$'
options_member=': warning: Member .* \(function\) of (struct|class) ([A-Za-z0-9_]+::)*[A-Za-z0-9_]*Options is not documented\.$'
constructor=': warning: Member ([A-Za-z0-9_]+)\(.*\(function\) of (struct|class) ([A-Za-z0-9_]+::)*\1 is not documented\.$'
{
  grep -E "$undocumented_member" "$all" || true
  grep -E "$options_member" "$all" | grep -v -E "$constructor" || true
} > "$allowed"
grep -v -x -F -f "$allowed" "$all" > "$log" || true
# Doxygen does not warn about an undocumented namespace; it leaves the namespace's page out, and
# its functions with it. Every namespace the public headers open must be in the list of
# namespaces this run wrote (a page left by an earlier run proves nothing).
while read -r ns; do
  page="namespace$(echo "$ns" | sed 's/_/__/g; s/::/_1_1/g').html"
  grep -q "href=\"$page\"" "$out/html/namespaces.html" ||
    echo "docs.sh: namespace $ns is not documented (doxygen leaves out its page)" >> "$log"
done < <(grep -rhoE --include='*.hpp' --exclude-dir=detail '^namespace xgrad(::[a-z_]+)* [{]' \
           xgrad.hpp core nn optim weights inspect distributed text | cut -d' ' -f2 | sort -u)
if [ -s "$log" ]; then
  cat "$log" >&2
  echo "docs.sh: $(grep -c . "$log") warning line(s) above; the reference is not complete" >&2
  exit 1
fi
echo "docs.sh: API reference written to $out/html/index.html"

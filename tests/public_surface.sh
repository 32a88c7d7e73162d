#!/bin/bash
# The library's public surface (docs/layout: include/rpa/ is the API):
#  (1) librpa's objects give default visibility (what a shared librpa.so
#      exports) to no symbol of rpa::internal, and do hide some, so the check
#      sees the library's own code;
#  (2) the `rpa` command (tools/) includes only the public headers, the test
#      support (testing/) and its own files.
# Usage: public_surface.sh <librpa.a> <source dir>
set -euo pipefail
library=$1
source_dir=$2

if [[ $library == *.so* ]]; then
  # A shared library: its dynamic symbols are what it exports.
  exported=$(nm -DC --defined-only "$library")
  if grep -q 'rpa::internal' <<<"$exported"; then
    echo "$library exports symbols of rpa::internal:"
    grep 'rpa::internal' <<<"$exported" | head -20
    exit 1
  fi
  symbols=$(readelf -sW --demangle "$library" | awk '$7 != "UND"')
else
  symbols=$(readelf -sW --demangle "$library" |
    awk '($5 == "GLOBAL" || $5 == "WEAK") && $7 != "UND"')
fi
exported_internal=$(awk '$6 == "DEFAULT"' <<<"$symbols" | grep -c 'rpa::internal' || true)
# Hidden in the objects; local once linked into a shared library.
hidden_internal=$(awk '$6 == "HIDDEN" || $5 == "LOCAL"' <<<"$symbols" | grep -c 'rpa::internal' || true)
if [[ $exported_internal -ne 0 ]]; then
  echo "$library gives default visibility to $exported_internal symbols of rpa::internal:"
  awk '$6 == "DEFAULT"' <<<"$symbols" | grep 'rpa::internal' | head -20
  exit 1
fi
if [[ $hidden_internal -eq 0 ]]; then
  echo "$library: no hidden rpa::internal symbol found; is it the library?"
  exit 1
fi

private_includes=$(grep -rn '#include "' "$source_dir/tools" |
  grep -v -E '#include "(rpa/|testing/|demo/|commands\.h|bench_mla\.h)' || true)
if [[ -n $private_includes ]]; then
  echo "the rpa command includes the library's private headers (use include/rpa/, or testing/):"
  echo "$private_includes"
  exit 1
fi
echo "public surface: $hidden_internal internal symbols hidden, none exported; tools/ includes public headers only"

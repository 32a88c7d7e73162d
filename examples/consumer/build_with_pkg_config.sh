#!/usr/bin/env bash
# Builds main.cc with nothing but pkg-config and the compiler, as a Makefile
# project would, then runs it:
#   examples/consumer/build_with_pkg_config.sh <rpa's install prefix> <output dir>
set -euo pipefail
prefix="$(cd "$1" && pwd)"
out="$2"
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$out"
for pc in "$prefix"/lib*/pkgconfig/rpa.pc "$prefix"/lib/*/pkgconfig/rpa.pc; do
  [ -f "$pc" ] && break
done
[ -f "$pc" ] || { echo "no rpa.pc under $prefix" >&2; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
echo "pkg-config: rpa $(pkg-config --modversion rpa): $(pkg-config --cflags --libs rpa)"
# The Cflags carry no -std: rpa's headers need C++20.
${CXX:-c++} -std=c++20 -O1 "$here/main.cc" -o "$out/rpa_consumer" \
  $(pkg-config --cflags --libs rpa) -Wl,-rpath,"$(pkg-config --variable=libdir rpa)"
"$out/rpa_consumer"

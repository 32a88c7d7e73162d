#!/usr/bin/env bash
# Compiles the library's sources for aarch64 (Highway's Arm targets among
# BUILD's RPA_HWY_TARGETS) with Debian's cross compiler and the flags CMake gives them in
# BUILD (default build/, configured and built first by `make check-arm`):
# proof that rpa builds for Arm, which this x86 machine cannot run. Object
# files only; nothing is linked or run.
set -euo pipefail

build="${1:-build}"
flags="$build/CMakeFiles/rpa_objects.dir/flags.make"
[ -f "$flags" ] || { echo "check-arm: configure $build first (make build)" >&2; exit 1; }

if ! command -v aarch64-linux-gnu-g++ > /dev/null; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends g++-aarch64-linux-gnu
fi

value() { sed -n "s/^$1 = //p" "$flags"; }
out="$build/arm"
mkdir -p "$out/include"
# Highway's headers are architecture-independent; only they are taken from
# the host (a whole -I/usr/include would bring x86's C library headers).
ln -sfn /usr/include/hwy "$out/include/hwy"

eval "defines=($(value CXX_DEFINES))"
eval "includes=($(value CXX_INCLUDES))"
eval "cxxflags=($(value CXX_FLAGS))"
count=0
for source in src/*.cc src/*/*.cc; do
  object="$out/$(echo "$source" | tr / _).o"
  aarch64-linux-gnu-g++ "${defines[@]}" "${includes[@]}" -isystem "$out/include" \
    "${cxxflags[@]}" -c "$source" -o "$object"
  count=$((count + 1))
done
echo "check-arm: $count sources compiled for aarch64 ($(aarch64-linux-gnu-g++ -dumpfullversion))"

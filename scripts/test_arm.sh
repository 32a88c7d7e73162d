#!/usr/bin/env bash
# `make test-arm`: the C++ tests cross-built for aarch64 (Debian's
# g++-aarch64-linux-gnu, the arm64 multiarch libhwy-dev and libgtest-dev;
# cmake/aarch64-linux-gnu.cmake) and the whole suite run under qemu-user
# (`-cpu max`: SVE2 at 512 bits) with Highway's NEON, SVE and SVE2 targets,
# then the target grid again at SVE's longest vectors (2048 bits), wider than
# the kernels' capped f32 vectors (docs/kernel.md "Build knobs").
# Installs what is missing. Usage: test_arm.sh [BUILD_DIR] [JOBS].
set -euo pipefail

build="${1:-build-arm}"
jobs="${2:-$(nproc)}"
# Every suite the aarch64 build has (the x86-only ones skip themselves);
# RPA_ARM_TEST_FILTER narrows it.
filter="${RPA_ARM_TEST_FILTER:-*}"

missing=()
command -v aarch64-linux-gnu-g++ > /dev/null || missing+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64-static > /dev/null || missing+=(qemu-user-static)
for p in libhwy-dev:arm64 libgtest-dev:arm64 libc6:arm64 libstdc++6:arm64; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "test-arm: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  dpkg --print-foreign-architectures | grep -qx arm64 || $sudo dpkg --add-architecture arm64
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

start=$(date +%s)
cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/aarch64-linux-gnu.cmake" \
  -DCMAKE_BUILD_TYPE=Release -DRPA_BUILD_TOOLS=OFF -DRPA_BUILD_PYTHON=OFF -DRPA_BUILD_BENCH=OFF \
  -DRPA_ONEDNN_PEER=OFF -DRPA_INSTALL=OFF '-DRPA_HWY_TARGETS=NEON;SVE;SVE2' > /dev/null
cmake --build "$build" -j "$jobs" --target rpa_tests
built=$(date +%s)
# qemu runs the binary with the arm64 multiarch loader and C library (-L /),
# the ones its libraries (libhwy, libstdc++) were installed with. Not the
# cross toolchain's /usr/aarch64-linux-gnu: its ld.so (2.36-8cross1) with the
# multiarch libc (2.36-9+deb12u*) spins forever in pthread_create, so every
# test that starts a thread hung (docs/kernel_log.md).
qemu-aarch64-static -cpu max -L / "$build/tests/rpa_tests" --gtest_filter="$filter" --gtest_brief=1
if [ "$filter" = "*" ]; then
  qemu-aarch64-static -cpu max,sve-default-vector-length=256 -L / "$build/tests/rpa_tests" \
    --gtest_filter='Targets/*SVE*' --gtest_brief=1
fi
echo "test-arm: built in $((built - start)) s, ran in $(( $(date +%s) - built )) s (qemu-aarch64)"

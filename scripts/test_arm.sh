#!/usr/bin/env bash
# `make test-arm`: the C++ tests cross-built for aarch64 (Debian's
# g++-aarch64-linux-gnu, the arm64 multiarch libhwy-dev and libgtest-dev;
# cmake/aarch64-linux-gnu.cmake) and the kernel and validation suites run
# under qemu-user on Highway's NEON target (the one compiled for aarch64: SVE
# is refused at configure time, docs/kernel.md "Build knobs").
# Installs what is missing. Usage: test_arm.sh [BUILD_DIR] [JOBS].
set -euo pipefail

build="${1:-build-arm}"
jobs="${2:-$(nproc)}"
# The suites that exercise the SIMD code and its inputs' checks: every
# kernel path the target has (Targets/KernelTargetTest/<target>), dispatch,
# the plan and the validation of every entry point.
filter="${RPA_ARM_TEST_FILTER:-*Kernel*:*Validate*:PlanTest.*:ThreadPoolTest.*}"

missing=()
command -v aarch64-linux-gnu-g++ > /dev/null || missing+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64-static > /dev/null || missing+=(qemu-user-static)
for p in libhwy-dev:arm64 libgtest-dev:arm64; do
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
  -DRPA_ONEDNN_PEER=OFF -DRPA_INSTALL=OFF > /dev/null
cmake --build "$build" -j "$jobs" --target rpa_tests
built=$(date +%s)
# qemu runs the binary with the target's loader and C library.
qemu-aarch64-static -L /usr/aarch64-linux-gnu "$build/tests/rpa_tests" --gtest_filter="$filter" \
  --gtest_brief=1
echo "test-arm: built in $((built - start)) s, ran in $(( $(date +%s) - built )) s (qemu-aarch64)"

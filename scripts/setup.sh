#!/usr/bin/env bash
# Installs, with apt-get, the Debian 12 packages rpa needs that are missing.
# Does nothing (and needs no network) when everything is there.
set -euo pipefail

packages=(
  cmake make g++ pkg-config
  libhwy-dev googletest libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev
  libcairo2-dev fonts-dejavu-core  # `rpa demo --plot`: Cairo draws and writes the PNG
  libdnnl-dev  # oneDNN: only `rpa bench`'s peer (testing/onednn_peer.h), never the library
  clang libclang-rt-14-dev
  python3 python3-dev pybind11-dev python3-numpy python3-pytest python3-torch
  python3-venv python3-pip python3-setuptools python3-wheel
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"

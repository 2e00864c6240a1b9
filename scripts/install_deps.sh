#!/usr/bin/env bash
# Installs the Debian packages xgrad builds with, but only those that are missing.
set -euo pipefail

packages=(cmake make g++ libxtensor-dev libxtensor-blas-dev xtl-dev libxsimd-dev libopenblas-dev libdnnl-dev ocl-icd-opencl-dev
          catch2 nlohmann-json3-dev libcli11-dev clang libclang-rt-14-dev libopenmpi-dev openmpi-bin
          chromium fonts-noto-cjk libpng-dev doxygen clang-format-14 pkgconf libpcre2-dev libsentencepiece-dev libicu-dev)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "xgrad: the ${#packages[@]} packages xgrad builds with are installed"
  exit 0
fi

echo "xgrad: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"

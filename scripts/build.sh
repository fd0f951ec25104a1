#!/usr/bin/env bash
# Configures and builds zps into build/ (programs in build/bin/). Extra arguments go to cmake.
# Both README commands (scripts/main.sh, scripts/test.sh) build through here with the same
# configuration, warnings as errors included, so the second reuses what the first built.
# ZPS_WERROR=OFF turns warnings as errors off (e.g. for another compiler than Debian 12's).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${ZPS_BUILD_DIR:-build}
JOBS=${ZPS_JOBS:-$(nproc)}
# ccache, when present; paths below the checkout are hashed relative to it, so a fresh clone
# elsewhere on the same machine reuses the cache.
launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  # With -g ccache also hashes the working directory (hash_dir), so without this a clone
  # in another folder never hit; the price is debug info naming the first clone's folder.
  export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
fi
cmake -S . -B "$BUILD_DIR" -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=${ZPS_BUILD_TYPE:-RelWithDebInfo} \
  -DZPS_WERROR=${ZPS_WERROR:-ON} "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"

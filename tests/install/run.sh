#!/usr/bin/env bash
# install.consumer: installs the built tree into a temporary prefix (no rebuild), then
# configures, builds and runs tests/install/consumer/ against it with find_package(zps CONFIG).
#   run.sh BUILD_DIR SOURCE_DIR [CXX_FLAGS]   (CXX_FLAGS: e.g. the build's -fsanitize=...)
set -euo pipefail
build=$1 src=$2 flags=${3:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zps-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; exit 1; }
for f in bin/zps-server bin/zps-ckpt include/zps/worker/client.h include/zps/common/status.h \
         lib/libzps_worker.a lib/libzps_base.a lib/libzps_wire.a lib/libzps_metrics.a \
         lib/cmake/zps/zpsConfig.cmake \
         lib/cmake/zps/zpsTargets.cmake; do
  [[ -e "$tmp/prefix/$f" ]] || { echo "install.consumer: $f not installed" >&2; exit 1; }
done
# Only the prefix: the consumer must not see zps's source or build tree.
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$src/tests/install/consumer" -B "$tmp/build" "${generator[@]}" \
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$tmp/prefix" \
      -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >"$tmp/configure.log" ||
  { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/build" >"$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }
"$tmp/build/zps_consumer"
echo "install.consumer: ok"

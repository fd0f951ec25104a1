#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the main job on its
# embedded default: a local cluster of 2 zps-server shards and 2 zps-train workers on loopback
# that trains a byte-level transformer on the Debian license texts for about two minutes and
# prints the loss falling. Extra arguments go to zps-train (see build/bin/zps-train --help).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
exec ./build/bin/zps-train "$@"

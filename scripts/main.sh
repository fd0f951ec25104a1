#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the main job on its
# embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
exec ./build/bin/zps-bench optimizer --params 67108864

#!/usr/bin/env bash
# The README's test command: installs what is missing, builds with warnings as errors, and runs
# every test (unit, integration, chart validation). Ends with ctest's summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh -DZPS_WERROR=ON
cd "${ZPS_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 900 -j "${ZPS_TEST_JOBS:-2}"

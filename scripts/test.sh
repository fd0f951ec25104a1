#!/usr/bin/env bash
# The README's test command: installs what is missing, builds with warnings as errors, and runs
# every test (unit, integration, chart validation). Ends with ctest's summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh -DZPS_WERROR=ON
# libFuzzer + ASan/UBSan: every fuzz target for ZPS_FUZZ_SECONDS (default 20) in a clang build
# of the decoders (build-fuzz/; about 2 min of fuzzing plus its build). ZPS_SKIP_FUZZ=1 skips it.
if [[ -z ${ZPS_SKIP_FUZZ:-} ]] && command -v clang++ >/dev/null 2>&1; then
  ZPS_FUZZ_SECONDS=${ZPS_FUZZ_SECONDS:-20} ./scripts/fuzz.sh
fi
cd "${ZPS_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 900 -j "${ZPS_TEST_JOBS:-2}"

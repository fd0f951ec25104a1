#!/usr/bin/env bash
# The README's test command: installs what is missing, builds (warnings as errors), runs the
# clang stages (docs/testing.md), then every test (unit, integration, chart validation). Ends
# with ctest's summary line; any stage that fails makes the exit status non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/ctest-failures.sh
tsan_dir=${ZPS_TSAN_BUILD_DIR:-build-tsan}
[[ $tsan_dir == /* ]] || tsan_dir=$PWD/$tsan_dir  # scripts/tsan.sh builds there
./scripts/install-deps.sh
./scripts/build.sh  # the same configuration as scripts/main.sh: what it built is reused
# Every tracked C++ file formatted as .clang-format says; a failure fails the run at the end.
format_rc=0
./scripts/check-format.sh || format_rc=$?
# libFuzzer + ASan/UBSan: every fuzz target for ZPS_FUZZ_SECONDS (default 20) in a clang build
# of the decoders (build-fuzz/; about 2 min of fuzzing plus its build). ZPS_SKIP_FUZZ=1 skips it.
if [[ -z ${ZPS_SKIP_FUZZ:-} ]] && command -v clang++ >/dev/null 2>&1; then
  ZPS_FUZZ_SECONDS=${ZPS_FUZZ_SECONDS:-20} ./scripts/fuzz.sh
fi
# clang 14 with -Wthread-safety -Werror and ThreadSanitizer (build-tsan/): every library, and the
# unit and integration tests of the threaded code under TSan (scripts/tsan.sh, docs/testing.md).
# ZPS_SKIP_TSAN=1 skips it.
tsan_rc=0
if [[ -z ${ZPS_SKIP_TSAN:-} ]]; then
  ./scripts/tsan.sh || tsan_rc=$?
  [[ $tsan_rc -eq 0 ]] || echo "FAIL: scripts/tsan.sh exited $tsan_rc (above); the main tests run, then this script fails"
fi
cd "${ZPS_BUILD_DIR:-build}"
main_rc=0
ctest --output-on-failure --timeout 900 -j "${ZPS_TEST_JOBS:-2}" || main_rc=$?
[[ $format_rc -eq 0 ]] || echo "FAIL: scripts/check-format.sh exited $format_rc (the files are listed above)"
if [[ $tsan_rc -ne 0 ]]; then
  echo "FAIL: scripts/tsan.sh exited $tsan_rc"
  print_ctest_failures "$tsan_dir" TSan
fi
[[ $format_rc -eq 0 && $tsan_rc -eq 0 && $main_rc -eq 0 ]]

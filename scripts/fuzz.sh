#!/usr/bin/env bash
# libFuzzer run of every fuzz target (tests/fuzz/) with ASan and UBSan: configures a clang build in
# build-fuzz/ (-DZPS_FUZZ=ON -DZPS_SANITIZE=address), builds only the fuzz targets, and runs each
# for ZPS_FUZZ_SECONDS (default 30) from its committed seed corpus (tests/fuzz/corpus/<target>,
# read-only; new inputs go to build-fuzz/corpus/<target>). A crash stops the run: its input is in
# build-fuzz/artifacts/<target>/ — add it to tests/fuzz/corpus/<target>/ as
# crash-<what> (the replay tests then run it in every test run) and fix the decoder.
# Usage: scripts/fuzz.sh [target...]     ZPS_FUZZ_MERGE=1: merge what was found into the seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${ZPS_FUZZ_BUILD_DIR:-build-fuzz}
SECONDS_EACH=${ZPS_FUZZ_SECONDS:-30}
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(frame messages am_headers job_layout config checkpoint)
source scripts/lib/sanitizer-tree.sh
configure_sanitizer_tree "$BUILD_DIR" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DZPS_FUZZ=ON -DZPS_SANITIZE=address -DZPS_WITH_CUDA=OFF
cmake --build "$BUILD_DIR" -j "${ZPS_JOBS:-$(nproc)}" --target "${targets[@]/#/fuzz_}"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=0
for t in "${targets[@]}"; do
  seeds=tests/fuzz/corpus/$t
  work=$BUILD_DIR/corpus/$t
  art=$BUILD_DIR/artifacts/$t
  mkdir -p "$work" "$art"
  # -rss_limit_mb / -malloc_limit_mb: an allocation sized by untrusted bytes is a finding too.
  if ! "$BUILD_DIR/bin/fuzz_$t" "$work" "$seeds" -max_total_time="$SECONDS_EACH" \
       -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 -print_final_stats=1 \
       -artifact_prefix="$art/" > "$BUILD_DIR/fuzz_$t.log" 2>&1; then
    echo "FAIL fuzz_$t: $(grep -m1 -E 'ERROR|SUMMARY|deadly' "$BUILD_DIR/fuzz_$t.log" || tail -n 1 "$BUILD_DIR/fuzz_$t.log")"
    echo "  input: $(ls "$art" | head -1)  log: $BUILD_DIR/fuzz_$t.log"
    failed=$((failed + 1))
    continue
  fi
  runs=$(grep -m1 -oE 'stat::number_of_executed_units: *[0-9]+' "$BUILD_DIR/fuzz_$t.log" | grep -oE '[0-9]+$' || echo '?')
  cov=$(grep -oE 'cov: [0-9]+' "$BUILD_DIR/fuzz_$t.log" | tail -n 1 || true)
  echo "PASS fuzz_$t: ${SECONDS_EACH} s, $runs inputs, $cov, corpus $(ls "$work" | wc -l) + $(ls "$seeds" | wc -l) seeds"
  if [[ -n ${ZPS_FUZZ_MERGE:-} ]]; then
    "$BUILD_DIR/bin/fuzz_$t" -merge=1 "$seeds" "$work" > /dev/null 2>&1
  fi
done
[[ $failed -eq 0 ]] || { echo "FAIL: $failed fuzz target(s) crashed"; exit 1; }
echo "PASS: every fuzz target ran ${SECONDS_EACH} s without a crash"

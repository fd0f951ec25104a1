#!/usr/bin/env bash
# The clang stage (docs/testing.md): clang 14 with -Wthread-safety and -Wthread-safety-beta as
# errors (the GUARDED_BY / REQUIRES annotations of zps/common/thread_annotations.h, and the lock
# order of its ACQUIRED_BEFORE / ACQUIRED_AFTER) and ThreadSanitizer, into build-tsan/.
# It compiles every library (so the analysis sees every lock) and zps-server, but only the test
# programs of the TSan subset; then runs their tests under TSan. Ends with ctest's summary line.
#   ZPS_TSAN_BUILD_ONLY=1 ./scripts/tsan.sh   # the thread-safety build alone
#   ./scripts/tsan.sh -R RpcTest               # extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${ZPS_TSAN_BUILD_DIR:-build-tsan}
JOBS=${ZPS_JOBS:-$(nproc)}
# The test programs whose tests run under TSan: the threaded components (RPC, UCX, metrics
# exporter, thread pool, shard state with speculation, snapshots and spill, coordinator, KV store,
# checkpoint store, NVMe engine, worker internals) and the integration tests of a real shard
# (in process: bad input, and a worker Client against two ShardServers; as zps-server processes:
# dead shards, the optimizer surface). Left out
# (docs/testing.md): the per-ISA matrices (test_common, test_server_optimizer: single-threaded
# kernels, 3x each), the trainer's kernels, the Gloo collectives (Gloo is not instrumented: a
# false race, and past 300 s), and the multi-process shell scripts (too slow for CI under TSan).
TESTS=(test_rpc test_ucx test_ucx_peer test_metrics test_shard test_server_kv
       test_checkpoint test_nvme test_worker_internal test_server_bad_input test_worker_dead_shard
       test_worker_optimizer_surface test_worker_client)
source scripts/lib/sanitizer-tree.sh
configure_sanitizer_tree "$BUILD_DIR" -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DZPS_SANITIZE=thread -DZPS_WERROR=ON
rm -f "$BUILD_DIR/Testing/Temporary/LastTestsFailed.log"  # what scripts/test.sh reports at its end
# Every library target (libzps_*.a, libzps_c.so), zps-server, and the subset's tests.
mapfile -t libs < <(ninja -C "$BUILD_DIR" -t targets all | grep -oE '^lib/libzps[^:]*\.(a|so)' | sort -u)
[[ ${#libs[@]} -gt 0 ]] || { echo "tsan.sh: no library targets found in $BUILD_DIR"; exit 1; }
tests=()
for t in "${TESTS[@]}"; do
  ninja -C "$BUILD_DIR" -t query "bin/$t" >/dev/null 2>&1 && tests+=("bin/$t")
done
# Program sources outside the libraries that take a lock (zps-bench's transport benchmark):
# compiled (not linked) for the analysis.
objs=()
while read -r o; do
  src=$(sed -E 's#CMakeFiles/[^/]+\.dir/##; s#\.o$##' <<<"$o")
  grep -q 'Mutex' "$src" 2>/dev/null && objs+=("$o")
done < <(ninja -C "$BUILD_DIR" -t targets all | grep -oE '^(bench|train)/CMakeFiles/[^:]*\.cc\.o')
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${libs[@]}" "${objs[@]}" bin/zps-server "${tests[@]}"
[[ ${ZPS_TSAN_BUILD_ONLY:-0} == 1 ]] && exit 0
cd "$BUILD_DIR"
# UCX's malloc/mmap hooks and TSan's interceptors do not mix; zps needs neither.
export UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=4 suppressions=$PWD/../tests/tsan.supp ${TSAN_OPTIONS:-}"
# Only the tests of the programs built above (the others are registered as *_NOT_BUILT), not the
# scripted ones. Left out (docs/testing.md): UcxPairTest.StopCompletesPendingOperations does not
# finish under TSan; CheckpointStore.KilledWriterNeverBreaksTheLastCheckpoint needs its child
# process to commit a checkpoint within 0.3 to 1 s, which a TSan child on a loaded machine does not.
ctest --output-on-failure --timeout 600 -j "${ZPS_TEST_JOBS:-2}" -LE 'torch|gpu' \
  -E '_NOT_BUILT|^integration\.|^chart\.|^install|^fuzz\.|StopCompletesPendingOperations|KilledWriterNeverBreaksTheLastCheckpoint' "$@"

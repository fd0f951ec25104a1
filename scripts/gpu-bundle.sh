#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on a GPU machine that has Python and torch but no Debian
# packages (no UCX, RocksDB, liburing): zps-server and libzps_c.so from build/, stripped, with
# the shared libraries they load (and, for zps-server, Debian's loader and C library, so it runs
# whatever the host's glibc is). Into .gpu/ (ignored by git; carry it). Prints its size.
# zps-bench comes too (its `cuda` sub-command, run by gpu-check.sh), with the CUDA runtime
# (libcudart.so.13, 0.7 MiB) that the CUDA backend opens with dlopen; NCCL (218 MiB) does not fit
# the 64 MiB bundle: the backend takes the libnccl.so.2 that the machine's torch brings.
# Debian's ucx_perftest (ucx-utils) comes too, for `gpu-check.sh --cpu-targets`
# (scripts/bench-transport.sh there); UCX's shm (posix, sysv) and tcp transports are built into
# libuct, and cma is the one module they need (lib/ucx/). The bundle must stay within 64 MiB
# (what a session may carry to that machine): the script fails if it does not.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -f build/lib/libzps_c.so && -x build/bin/zps-server && -x build/bin/zps-bench ]] || ./scripts/build.sh
out=.gpu
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib/ucx" "$out/sys"
strip -o "$out/bin/zps-server" build/bin/zps-server
strip -o "$out/lib/libzps_c.so" build/lib/libzps_c.so
strip -o "$out/bin/zps-bench" build/bin/zps-bench
[[ -x build/bin/test_worker_cuda_gpu ]] && strip -o "$out/bin/test_worker_cuda_gpu" build/bin/test_worker_cuda_gpu
perftest=$(command -v ucx_perftest || true)
[[ -n $perftest ]] && strip -o "$out/bin/ucx_perftest" "$perftest"
copy_deps() {  # $1 binary, $2 destination; skips the C library and the loader
  ldd "$1" | awk '/=> \//{print $3}' | while read -r lib; do
    case $(basename "$lib") in
      libc.so.*|libm.so.*|ld-linux*|libpthread.so.*|libdl.so.*|librt.so.*) ;;
      # The C++ runtime only for zps-server (sys/): on LD_LIBRARY_PATH it could shadow a newer
      # one that the host's torch needs. libzps_c.so has its own linked in. So too OpenMP's
      # runtime, which only ucx_perftest loads.
      libstdc++.so.*|libgcc_s.so.*|libgomp.so.*) cp -L "$lib" "$out/sys/";;
      *) cp -L "$lib" "$2/";;
    esac
  done
}
copy_deps build/lib/libzps_c.so "$out/lib"
copy_deps build/bin/zps-server "$out/lib"
copy_deps build/bin/zps-bench "$out/lib"
[[ -n $perftest ]] && copy_deps "$perftest" "$out/lib"
cudart=${CUDA_HOME:-/usr/local/cuda}/lib64/libcudart.so.13
[[ -f $cudart ]] && cp -L "$cudart" "$out/lib/"
cp -L /usr/lib/x86_64-linux-gnu/ucx/libuct_cma.so.0 "$out/lib/ucx/" 2>/dev/null || true
# zps-server runs through Debian's own loader and libc (see gpu-check.sh).
for f in /lib64/ld-linux-x86-64.so.2 /lib/x86_64-linux-gnu/libc.so.6 /lib/x86_64-linux-gnu/libm.so.6; do
  cp -L "$f" "$out/sys/"
done
# (in a git worktree .git is a file: ask git where the exclude file is)
exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
du -sh "$out"
mib=$(du -sm "$out" | cut -f1)
(( mib <= 64 )) || { echo "gpu-bundle.sh: $out is $mib MiB, over the 64 MiB one can carry" >&2; exit 1; }
[[ -n $perftest ]] ||
  echo "gpu-bundle.sh: no ucx_perftest (Debian ucx-utils): gpu-check.sh --cpu-targets skips the transport" >&2

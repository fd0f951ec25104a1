#!/usr/bin/env bash
# The GPU check, in one call of at most 10 minutes on a machine with one NVIDIA GPU, Python and
# torch 2.x, and none of Debian's packages: it runs from .gpu/ (scripts/gpu-bundle.sh, made on a
# Debian build machine and carried over).
#
#   scripts/gpu-bundle.sh                 # here: build, then pack .gpu/ (about 34 MiB)
#   scripts/gpu-check.sh                  # there (OUT=dir for the JSON results, default .gpu/out)
#
# It checks that a CUDA device is there (else says so — "no CUDA device" — and exits 0 with
# nothing measured), then:
#   1. zps-bench cuda: fetch throughput host -> device through a real shard and the CUDA
#      backend (pinned UCX-registered slots, copy stream) beside cudaMemcpyAsync from pinned
#      memory (the ceiling) in the same run; pushes device -> server beside pushes from host
#      memory (cuda.jsonl);
#   2. the GPU ctest program (test_worker_cuda_gpu, when bundled), a zps.torch CUDA test that
#      checks the backend carried the bytes (cuda_info), and test_device_dequant.py: quantized
#      weights dequantized by torch ops on the GPU, bit for bit against the CPU SIMD codec;
#   3. the TransformerEncoder LM (examples/train_lm.py) on CUDA through zps (embedded 2-shard
#      cluster on loopback, the CUDA backend) and with plain torch holding the whole model on
#      the GPU, for two model sizes: tokens/s and the ratio (lm.jsonl).
#
#   scripts/gpu-check.sh --cpu-targets    # there: issue 11's CPU benchmarks only (no GPU needed)
#
# --cpu-targets runs, instead of all the above, the benchmarks of issue 11 that need more cores
# than the 2-core build machine has (the emulated worker, UCX's progress thread and the shard's
# optimizer must not share cores), each under `timeout`, output in $OUT/<name>.txt: zps-bench
# overlap (192 MiB and 8 x 8 Mi elements, 1 and 4 optimizer threads), scripts/bench-transport.sh
# against the bundled ucx_perftest (shm, 4/16/64 MiB, 2 rounds) and zps-bench checkpoint-stall
# (1 GiB state, a checkpoint every 4 steps, in a temporary directory that it removes). 3.5-5
# minutes on the 2-core build machine, at most 9.5 (the limits); it exits 1 if any failed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mode=gpu
case ${1:-} in
  "") ;;
  --cpu-targets) mode=cpu ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
  *) echo "gpu-check.sh: unknown option $1 (--cpu-targets, --help)" >&2; exit 2 ;;
esac
out=${OUT:-$root/.gpu/out}
mkdir -p "$out"
py=${PYTHON:-python3}
[[ -d .gpu ]] || { echo "gpu-check: no .gpu/ bundle (run scripts/gpu-bundle.sh on the build machine)"; exit 1; }

# The server runs through the carried loader and C library; the Python process uses the host's
# C library and loads libzps_c.so (C++ runtime linked in) with the carried UCX beside it.
# The host's driver (libcuda.so.1) stays on the host's paths, after the carried ones.
hostlibs=/usr/lib/x86_64-linux-gnu:/usr/lib64:/usr/local/cuda/lib64:/usr/local/cuda/compat
libpath=$root/.gpu/sys:$root/.gpu/lib:$hostlibs
wrap() {  # $1 a program in .gpu/bin, $2 the script to write that runs it through the carried loader
  cat > "$2" <<SH
#!/bin/sh
exec "$root/.gpu/sys/ld-linux-x86-64.so.2" --library-path "$libpath" \
  "$root/.gpu/bin/$1" "\$@"
SH
  chmod +x "$2"
}
for prog in zps-server zps-bench; do
  wrap $prog .gpu/bin/$prog.sh
done
export ZPS_SERVER=$root/.gpu/bin/zps-server.sh
export ZPS_NATIVE_LIB=$root/.gpu/lib/libzps_c.so
export LD_LIBRARY_PATH=$root/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export UCX_MODULE_DIR=$root/.gpu/lib/ucx
export PYTHONPATH=$root/python
export ZPS_LOG_LEVEL=warning

# Issue 11's CPU targets (--cpu-targets): no CUDA device, torch or pytest needed.
# zps-bench transport and transport-raw start their peer with execv("/proc/self/exe"), which
# through the wrapper above is the loader, not zps-bench: so these run a copy of zps-bench whose
# ELF interpreter is the carried loader (through a link in /tmp: the path must fit in the 27
# bytes of /lib64/ld-linux-x86-64.so.2), with the library path in LD_LIBRARY_PATH for it and the
# peer it starts, and for nothing else (the host's programs must keep the host's C library). The
# copy and the wrappers go in .gpu/run/ (not /tmp, which may be noexec); all of it goes at exit.
cpu_targets() {
  local bench failed=0 libs outside
  # The host's programs here (python3 in bench-transport.sh) keep the host's libraries.
  LD_LIBRARY_PATH=${LD_LIBRARY_PATH#"$root/.gpu/lib"}
  LD_LIBRARY_PATH=${LD_LIBRARY_PATH#:}
  [[ -n $LD_LIBRARY_PATH ]] || unset LD_LIBRARY_PATH
  echo "== machine (CPU targets)"
  echo "$(nproc) cores ($(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')," \
    "$(awk '/^MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo) GiB)"
  wdir=$root/.gpu/run  # (these three global: the EXIT trap reads them)
  lddir=$(mktemp -d /tmp/zps.XXXXXX)
  ckpt=$(mktemp -d "${TMPDIR:-/tmp}/zps-ckpt-stall.XXXXXX")
  trap 'rm -rf "$wdir" "$lddir" "$ckpt"' EXIT
  ln -s "$root/.gpu/sys/ld-linux-x86-64.so.2" "$lddir/ld"
  rm -rf "$wdir"
  mkdir -p "$wdir/bin"
  cp .gpu/bin/zps-bench "$wdir/zps-bench"
  $py - "$wdir/zps-bench" "$lddir/ld" <<'PY'
import struct, sys
interp = sys.argv[2].encode() + b"\0"
with open(sys.argv[1], "r+b") as f:
    h = f.read(64)
    (phoff,), (phentsize, phnum) = struct.unpack_from("<Q", h, 32), struct.unpack_from("<HH", h, 54)
    for i in range(phnum):
        f.seek(phoff + i * phentsize)
        p_type, _, p_offset, _, _, p_filesz = struct.unpack("<IIQQQQ", f.read(40))
        if p_type == 3:  # PT_INTERP
            assert len(interp) <= p_filesz, "interpreter path too long"
            f.seek(p_offset)
            f.write(interp.ljust(p_filesz, b"\0"))
            break
    else:
        sys.exit("zps-bench has no PT_INTERP")
PY
  bench=$wdir/bin/zps-bench
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$libpath" "$wdir/zps-bench" > "$bench"
  chmod +x "$bench"
  # bench-transport.sh runs $BUILD_DIR/bin/zps-bench and the ucx_perftest on PATH.
  [[ -x .gpu/bin/ucx_perftest ]] && wrap ucx_perftest "$wdir/bin/ucx_perftest"
  libs=$(LD_LIBRARY_PATH=$libpath LD_TRACE_LOADED_OBJECTS=1 "$wdir/zps-bench" |
    awk '/=>/ {print $3}')
  outside=$(grep -v "^$root/.gpu/" <<<"$libs" | tr '\n' ' ' || true)
  echo "zps-bench: $(wc -l <<<"$libs") libraries, from outside .gpu/: ${outside:-none}"
  if [[ -x .gpu/bin/ucx_perftest ]]; then
    libs=$("$root/.gpu/sys/ld-linux-x86-64.so.2" --library-path "$libpath" \
      --list .gpu/bin/ucx_perftest | awk '/=>/ {print $3}')
    outside=$(grep -v "^$root/.gpu/" <<<"$libs" | tr '\n' ' ' || true)
    echo "ucx_perftest: $(wc -l <<<"$libs") libraries, from outside .gpu/: ${outside:-none}"
  fi
  run_target() {  # $1 name ($out/$1.txt), $2 limit in seconds, then the command
    local name=$1 limit=$2 rc=0 start=$SECONDS
    shift 2
    echo "== $name"
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.txt" || rc=$?
    if (( rc != 0 )); then
      echo "gpu-check: $name FAILED (exit $rc$( ((rc == 124)) && echo ", over ${limit} s"))"
      failed=$((failed + 1))
    fi
    echo "($name: $((SECONDS - start)) s)"
  }
  run_target overlap 45 "$bench" overlap
  run_target overlap-threads4 45 "$bench" overlap --threads 4
  run_target overlap-8x8Mi 75 "$bench" overlap --layer-elems 8MiB --steps 8
  run_target overlap-8x8Mi-threads4 75 "$bench" overlap --layer-elems 8MiB --steps 8 --threads 4
  if [[ -x .gpu/bin/ucx_perftest ]]; then
    run_target transport 150 env BUILD_DIR="$wdir" PATH="$wdir/bin:$PATH" \
      scripts/bench-transport.sh --tls shm --reps 2 --sizes 4MiB,16MiB,64MiB
  else
    echo "gpu-check: no ucx_perftest in the bundle (scripts/gpu-bundle.sh); transport skipped"
    failed=$((failed + 1))
  fi
  run_target checkpoint-stall 180 "$bench" checkpoint-stall --dir "$ckpt" --every 4 --steps 17
  echo "gpu-check --cpu-targets: $failed failed; output in $out"
  (( failed == 0 ))
}
if [[ $mode == cpu ]]; then
  cpu_targets
  exit
fi

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
$py -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.is_available() and torch.cuda.get_device_name(0))' 2>/dev/null ||
  echo "python: $($py --version 2>&1), no torch"
"$ZPS_SERVER" --help >/dev/null && echo "zps-server runs from the bundle"
bench=$root/.gpu/bin/zps-bench.sh
echo "== zps-bench cuda"
if [[ -x .gpu/bin/zps-bench ]]; then
  bench_out=$(timeout 300 "$bench" cuda --json --size 64MiB --params 8 --reps 3)
  echo "$bench_out" | tee "$out/cuda.jsonl"
  if grep -q "no CUDA device" <<<"$bench_out"; then
    echo "gpu-check: no CUDA device here; nothing measured"
    exit 0
  fi
else
  echo "zps-bench is not in the bundle (rebuild it with scripts/gpu-bundle.sh)"
fi
if ! $py -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu-check: no CUDA device here (or no torch); nothing measured"
  exit 0
fi
$py - "$out/cuda.jsonl" <<'PY' || true
import json, sys
rows = {r["op"]: r for r in map(json.loads, open(sys.argv[1])) if "op" in r}
def ratio(a, b):
    if a in rows and b in rows:
        print(f"{a} {rows[a]['gb_per_s']:.2f} GB/s against {b} {rows[b]['gb_per_s']:.2f} GB/s: "
              f"{rows[a]['gb_per_s'] / rows[b]['gb_per_s']:.2f}")
ratio("fetch_h2d", "h2d_ceiling"); ratio("fetch_h2d", "fetch_host")
ratio("push_d2h", "push_host"); ratio("push_d2h", "d2h_ceiling")
PY
if [[ -x .gpu/bin/test_worker_cuda_gpu ]]; then
  echo "== GPU tests (CUDA backend, NCCL)"
  timeout 120 "$root/.gpu/sys/ld-linux-x86-64.so.2" --library-path "$root/.gpu/sys:$root/.gpu/lib:$hostlibs" \
    .gpu/bin/test_worker_cuda_gpu | tail -5 || echo "gpu tests: FAILED"
fi

if $py -c 'import pytest' 2>/dev/null; then
  echo "== tests/torch/test_cuda.py (the CUDA backend against host staging)"
  (cd tests/torch && timeout 180 $py -m pytest -q -p no:cacheprovider test_cuda.py -rs) |
    tail -8 || echo "test_cuda.py: FAILED"
  echo "== tests/torch/test_device_dequant.py (quantized weights dequantized on the GPU)"
  (cd tests/torch && timeout 180 $py -m pytest -q -p no:cacheprovider test_device_dequant.py -rs) |
    tail -8 || echo "test_device_dequant.py: FAILED"
fi

echo "== zps.torch CUDA test"
timeout 120 $py - <<'PY' | tee "$out/cuda-test.txt"
import torch, torch.nn as nn, torch.nn.functional as F
import zps.torch as zt
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 8)).cuda()
x, y = torch.randn(128, 64, device="cuda"), torch.randn(128, 8, device="cuda")
with zt.initialize(model, {"optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
                           "zps": {"shards": 2}}) as engine:
    losses = []
    for _ in range(30):
        loss = F.mse_loss(engine(x), y); engine.backward(loss); engine.step()
        losses.append(loss.item())
    assert all(p.is_cuda for p in model.parameters())
    assert losses[-1] < 0.5 * losses[0], losses
    info = engine.client.cuda_info()
    assert info["device"] == 0 and info["h2d_bytes"] > 0 and info["d2h_bytes"] > 0, info
    print(f"cuda training through zps: loss {losses[0]:.4f} -> {losses[-1]:.4f}: ok; backend {info}")
PY

echo "== TransformerEncoder LM on CUDA: zps against plain torch"
for size in "512 4" "1024 8"; do
  set -- $size
  for mode in plain zps; do
    extra=(); [[ $mode == plain ]] && extra=(--plain)
    timeout 200 $py examples/train_lm.py --device cuda --steps 40 --batch 32 --seq-len 128 \
      --d-model "$1" --layers "$2" --threads 8 --shards 2 "${extra[@]}" |
      grep '^{"result"' | tee -a "$out/lm.jsonl"
  done
done
$py - "$out/lm.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for key in sorted({(r["d_model"], r["layers"]) for r in rows}):
    p = [r for r in rows if (r["d_model"], r["layers"]) == key and r["mode"] == "plain"][-1]
    z = [r for r in rows if (r["d_model"], r["layers"]) == key and r["mode"] == "zps"][-1]
    print(f"d_model {key[0]} x {key[1]} layers ({z['params']} params): plain {p['tokens_per_s']:.0f} "
          f"tokens/s, zps {z['tokens_per_s']:.0f} tokens/s, ratio {z['tokens_per_s'] / p['tokens_per_s']:.2f}")
PY

"""ctypes binding of libzps_c.so (python/native/zps_c.h): no torch, no Python C API.

The library is found, in order, at $ZPS_NATIVE_LIB, next to this package (the copy an installed
package carries: `pip install ./python` copies it from the build tree, python/setup.py), or in
the build tree (`$ZPS_BUILD_DIR/lib/libzps_c.so`, by default `build/` beside `python/`). Every
call that fails raises ZpsError with the C++ Status code and message.
"""

import atexit
import ctypes
import os
import pathlib
import threading

from zps._errors import ZpsError

F32, F16, BF16 = 0, 1, 2
DTYPE_NAMES = {F32: "fp32", F16: "fp16", BF16: "bf16"}
API_VERSION = 6


class JobInfo(ctypes.Structure):
    _fields_ = [("resume_step", ctypes.c_int64), ("loss_scale", ctypes.c_double),
                ("world_size", ctypes.c_uint32), ("rank", ctypes.c_uint32),
                ("num_params", ctypes.c_uint32), ("num_shards", ctypes.c_uint32),
                ("serving_dtype", ctypes.c_int32), ("grad_dtype", ctypes.c_int32),
                ("job_hash", ctypes.c_uint64), ("quant_bits", ctypes.c_uint32),
                ("quant_block", ctypes.c_uint32)]


class CommitInfo(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("skip", ctypes.c_int32),
                ("grad_scale", ctypes.c_float), ("global_norm", ctypes.c_double),
                ("loss_scale", ctypes.c_double), ("next_loss_scale", ctypes.c_double),
                ("optimizer_step", ctypes.c_int64), ("checkpoint", ctypes.c_int32)]


class Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "fetched_bytes", "pushed_bytes", "live_bytes", "acquires", "hits", "prefetches",
        "trace_rebuilds", "wait_ns", "gather_bytes")]


class QuantPiece(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("elems", "skip", "offset", "bytes")]


def _repo_root():
    return pathlib.Path(__file__).resolve().parent.parent.parent


def library_path():
    env = os.environ.get("ZPS_NATIVE_LIB")
    if env:
        return pathlib.Path(env)
    here = pathlib.Path(__file__).resolve().parent / "libzps_c.so"
    if here.exists():
        return here
    build = os.environ.get("ZPS_BUILD_DIR", str(_repo_root() / "build"))
    return pathlib.Path(build) / "lib" / "libzps_c.so"


_lib = None


def lib():
    """The loaded library (loaded once). Raises ZpsError when it is missing or too old."""
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    if not path.exists():
        raise ZpsError("NOT_FOUND", f"libzps_c.so not found at {path}: build zps first "
                       "(./scripts/build.sh), or set ZPS_NATIVE_LIB or ZPS_BUILD_DIR")
    L = ctypes.CDLL(str(path))
    c_int, c_u32, c_i64, c_u64, c_p = (ctypes.c_int, ctypes.c_uint32, ctypes.c_int64,
                                        ctypes.c_uint64, ctypes.c_void_p)
    sigs = {
        "zps_c_api_version": (c_int, []),
        "zps_last_error": (ctypes.c_char_p, []),
        "zps_code_name": (ctypes.c_char_p, [c_int]),
        "zps_connect": (c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(c_p)]),
        "zps_close": (None, [c_p]),
        "zps_cluster_shards": (c_int, [ctypes.c_char_p, ctypes.c_char_p, c_i64,
                                       ctypes.POINTER(c_u32)]),
        "zps_job_hash": (c_int, [ctypes.c_char_p, ctypes.POINTER(c_u64)]),
        "zps_check_memory_budget": (c_int, [ctypes.c_char_p, c_u64]),
        "zps_job_info_get": (c_int, [c_p, ctypes.POINTER(JobInfo)]),
        "zps_stats_get": (c_int, [c_p, ctypes.POINTER(Stats)]),
        "zps_push_initial": (c_int, [c_p, c_u32, c_p, c_u64]),
        "zps_begin_step": (c_int, [c_p, c_i64]),
        "zps_end_step": (c_int, [c_p]),
        "zps_fetch_into": (c_int, [c_p, ctypes.POINTER(c_u32), ctypes.c_size_t,
                                   ctypes.POINTER(c_p), ctypes.POINTER(ctypes.c_int32)]),
        "zps_acquire": (c_int, [c_p, c_u32, ctypes.POINTER(c_p), ctypes.POINTER(c_u64)]),
        "zps_release": (c_int, [c_p, c_u32]),
        "zps_acquire_quantized": (c_int, [c_p, c_u32, ctypes.POINTER(c_p), ctypes.POINTER(c_u64),
                                          ctypes.POINTER(QuantPiece), ctypes.c_size_t,
                                          ctypes.POINTER(ctypes.c_size_t)]),
        "zps_dequantize_blocks": (c_int, [c_p, c_u64, c_u32, c_u32, c_u64, c_u64, ctypes.c_int32,
                                          c_p]),
        "zps_push_grad": (c_int, [c_p, c_u32, c_i64, c_p, c_u64, c_u32]),
        "zps_flush": (c_int, [c_p]),
        "zps_await_pushes_below": (c_int, [c_p, c_u64]),
        "zps_await_commit": (c_int, [c_p, c_i64, ctypes.POINTER(CommitInfo)]),
        "zps_read_master": (c_int, [c_p, c_u32, c_i64, c_p]),
        "zps_shard_status": (c_int, [c_p, c_u32, ctypes.c_char_p, ctypes.c_size_t]),
        "zps_checkpoint_now": (c_int, [c_p, c_i64, ctypes.POINTER(c_i64)]),
        "zps_chunk_crcs": (c_int, [c_p, c_u32, c_i64, ctypes.POINTER(c_u32),
                                   ctypes.POINTER(c_u32), ctypes.c_size_t,
                                   ctypes.POINTER(ctypes.c_size_t)]),
        "zps_cuda_available": (c_int, [c_int]),
        "zps_fetch_to_device": (c_int, [c_p, ctypes.POINTER(c_u32), ctypes.c_size_t,
                                        ctypes.POINTER(c_p), c_u64]),
        "zps_push_grad_device": (c_int, [c_p, c_u32, c_i64, c_p, ctypes.c_int32, c_u64, c_u32,
                                         c_u64]),
        "zps_cuda_info": (c_int, [c_p, ctypes.c_char_p, ctypes.c_size_t]),
    }
    # The version first: an older library lacks some of the entry points bound below.
    L.zps_c_api_version.restype, L.zps_c_api_version.argtypes = c_int, []
    if L.zps_c_api_version() != API_VERSION:
        raise ZpsError("FAILED_PRECONDITION", f"{path} has C API version "
                       f"{L.zps_c_api_version()}, this package needs {API_VERSION}: rebuild it")
    for name, (res, args) in sigs.items():
        fn = getattr(L, name)
        fn.restype, fn.argtypes = res, args
    _lib = L
    return L


def check(rc):
    """Raises the ZpsError for a non-zero return code of a zps_* call."""
    if rc != 0:
        L = lib()
        raise ZpsError(L.zps_code_name(rc).decode(), L.zps_last_error().decode())


def cluster_shards(endpoint, token, timeout_ms):
    """The shard count of the job the coordinator at `endpoint` serves."""
    out = ctypes.c_uint32()
    check(lib().zps_cluster_shards(endpoint.encode(), token.encode(), timeout_ms,
                                   ctypes.byref(out)))
    return out.value


def cuda_available(device=0):
    """None when the CUDA backend can use `device` here, else the ZpsError saying why not
    (FAILED_PRECONDITION "no CUDA device: ..." on a machine without a runtime, driver or GPU)."""
    try:
        check(lib().zps_cuda_available(device))
    except ZpsError as e:
        return e
    return None


def check_memory_budget(job_json, memory_budget):
    """Raises the shard's own RESOURCE_EXHAUSTED advice when a shard of the job could not start
    with `memory_budget` bytes (zps_check_memory_budget); before any shard starts."""
    check(lib().zps_check_memory_budget(job_json.encode(), memory_budget))


def dequantize_blocks(ptr, nbytes, bits, block, skip, elems, dtype, dst):
    """The C library's CPU (SIMD) dequantization of block records at `ptr` (zps_dequantize_blocks):
    `elems` elements from `skip` into `dst` as `dtype` (F32, F16, BF16)."""
    check(lib().zps_dequantize_blocks(ptr, nbytes, bits, block, skip, elems, dtype, dst))


def job_hash(job_json):
    out = ctypes.c_uint64()
    check(lib().zps_job_hash(job_json.encode(), ctypes.byref(out)))
    return out.value


_abandoned = []  # connect threads given up on because a shard stopped (joined at exit)


def _join_abandoned():
    # Their zps_connect must return (at its connect_timeout) before the interpreter finalizes:
    # a thread still inside the library when the process tears it down could crash the exit.
    for t in _abandoned:
        t.join()


atexit.register(_join_abandoned)


def _connect_watched(L, options_json, job_json, watch):
    """zps_connect on a thread of its own, while the caller watches the embedded cluster: a
    shard that stops during the connect (it fails as it loads the job) is raised at once rather
    than after connect_timeout. The connect given up on closes its handle when it returns."""
    lock = threading.Lock()
    state = {"abandoned": False}

    def run():
        h = ctypes.c_void_p()
        rc = L.zps_connect(options_json.encode(), job_json.encode(), ctypes.byref(h))
        error = (L.zps_code_name(rc).decode(), L.zps_last_error().decode()) if rc else None
        with lock:
            state.update(rc=rc, h=h, error=error)
            if state["abandoned"] and rc == 0:
                L.zps_close(h)

    t = threading.Thread(target=run, name="zps-connect", daemon=True)
    t.start()
    while True:
        t.join(0.05)
        with lock:
            if "rc" in state:
                break
            stopped = watch.stopped()
            if stopped is not None:
                state["abandoned"] = True
                _abandoned.append(t)
                raise stopped
    if state["rc"] != 0:
        error = ZpsError(*state["error"])
        stopped = watch.stopped(error)
        if stopped is not None:
            raise stopped from error
        raise error
    return state["h"]


class Client:
    """One rank's connection to a zps job (zps::worker::Client plus its Prefetcher).

    Not thread-safe for the prefetching calls (begin_step, end_step, fetch_into, acquire,
    release): one training thread drives them. Pushes and commits may come from any thread.
    """

    def __init__(self, options_json, job_json, watch=None):
        """watch: the embedded cluster serving the job (zps.cluster.LocalCluster), or None. With
        one, a call made once a shard is known to have stopped raises that shard's ShardStopped
        error at once, without waiting for any timeout, and so does a call that fails because
        of it (the error it got is the cause)."""
        self._L = lib()
        self._watch = watch
        if watch is None:
            h = ctypes.c_void_p()
            check(self._L.zps_connect(options_json.encode(), job_json.encode(), ctypes.byref(h)))
        else:
            h = _connect_watched(self._L, options_json, job_json, watch)
        self._h = h

    def _check(self, rc):
        if rc == 0:
            return
        L = self._L
        error = ZpsError(L.zps_code_name(rc).decode(), L.zps_last_error().decode())
        stopped = self._watch.stopped(error) if self._watch is not None else None
        if stopped is not None:
            raise stopped from error
        raise error

    def _run(self, fn, *args):
        """fn(handle, *args), a zps_* call on this client, after asking the watched cluster."""
        if self._watch is not None:
            stopped = self._watch.stopped()
            if stopped is not None:
                raise stopped
        self._check(fn(self._h, *args))

    def close(self):
        if getattr(self, "_h", None):
            self._L.zps_close(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def info(self):
        out = JobInfo()
        self._run(self._L.zps_job_info_get, ctypes.byref(out))
        return out

    def stats(self):
        out = Stats()
        self._run(self._L.zps_stats_get, ctypes.byref(out))
        return out

    def push_initial(self, param, ptr, numel):
        self._run(self._L.zps_push_initial, param, ptr, numel)

    def begin_step(self, step):
        self._run(self._L.zps_begin_step, step)

    def end_step(self):
        self._run(self._L.zps_end_step)

    def fetch_into(self, ids, ptrs, dtypes):
        n = len(ids)
        self._run(self._L.zps_fetch_into, (ctypes.c_uint32 * n)(*ids), n,
                  (ctypes.c_void_p * n)(*ptrs), (ctypes.c_int32 * n)(*dtypes))

    def acquire(self, param):
        data, size = ctypes.c_void_p(), ctypes.c_uint64()
        self._run(self._L.zps_acquire, param, ctypes.byref(data), ctypes.byref(size))
        return data.value, size.value

    def acquire_quantized(self, param):
        """With options keep_quantized: (ptr, nbytes, pieces), the parameter's block records as
        fetched and its pieces [(elems, skip, offset, bytes)], valid until release(param)."""
        data, size, n = ctypes.c_void_p(), ctypes.c_uint64(), ctypes.c_size_t()
        cap = 64
        while True:
            pieces = (QuantPiece * cap)()
            try:
                self._run(self._L.zps_acquire_quantized, param, ctypes.byref(data),
                          ctypes.byref(size), pieces, cap, ctypes.byref(n))
                break
            except ZpsError as e:
                if e.code != "OUT_OF_RANGE" or cap >= 1 << 20:
                    raise
                cap *= 16
        return data.value, size.value, [(p.elems, p.skip, p.offset, p.bytes)
                                         for p in pieces[:n.value]]

    def release(self, param):
        self._run(self._L.zps_release, param)

    def push_grad(self, param, step, ptr, numel, micro=0):
        self._run(self._L.zps_push_grad, param, step, ptr, numel, micro)

    def await_pushes_below(self, max_pending):
        self._run(self._L.zps_await_pushes_below, max_pending)

    def flush(self):
        self._run(self._L.zps_flush)

    def await_commit(self, step):
        out = CommitInfo()
        self._run(self._L.zps_await_commit, step, ctypes.byref(out))
        return out

    def read_master(self, param, min_version, ptr):
        self._run(self._L.zps_read_master, param, min_version, ptr)

    def shard_status(self, ordinal=0):
        """Shard `ordinal`'s status document (a dict)."""
        import json
        buf = ctypes.create_string_buffer(1 << 16)
        self._run(self._L.zps_shard_status, ordinal, buf, len(buf))
        return json.loads(buf.value.decode())

    def chunk_crcs(self, ordinal, min_version):
        """[(chunk, crc32c)] of shard `ordinal`'s fp32 state once it reached `min_version`
        (raises UNAVAILABLE before): what bit-identical runs compare."""
        cap = 1 << 16
        chunks, crcs, n = (ctypes.c_uint32 * cap)(), (ctypes.c_uint32 * cap)(), ctypes.c_size_t()
        self._run(self._L.zps_chunk_crcs, ordinal, min_version, chunks, crcs, cap,
                  ctypes.byref(n))
        return [(chunks[i], crcs[i]) for i in range(n.value)]

    def fetch_to_device(self, ids, ptrs, stream):
        """Fetches `ids` into device memory (serving dtype), ordered on cudaStream_t `stream`."""
        n = len(ids)
        self._run(self._L.zps_fetch_to_device, (ctypes.c_uint32 * n)(*ids), n,
                  (ctypes.c_void_p * n)(*ptrs), stream)

    def push_grad_device(self, param, step, ptr, dtype, numel, micro, stream):
        self._run(self._L.zps_push_grad_device, param, step, ptr, dtype, numel, micro, stream)

    def cuda_info(self):
        import json
        buf = ctypes.create_string_buffer(4096)
        self._run(self._L.zps_cuda_info, buf, len(buf))
        return json.loads(buf.value.decode())

    def checkpoint_now(self, timeout_ms):
        out = ctypes.c_int64()
        self._run(self._L.zps_checkpoint_now, timeout_ms, ctypes.byref(out))
        return out.value

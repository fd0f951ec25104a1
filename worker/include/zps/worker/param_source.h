// zps/worker/param_source.h — where a Prefetcher gets parameters from: the few calls it makes on a
// Client (the layout, the serving dtype, the wait bound, and asynchronous fetches), as an
// interface, so that the Prefetcher's logic runs in-process against a fake source in tests
// (tests/unit/worker/prefetcher_test.cc). `Client` is the real implementation.
//
// FetchPromise is the completing side of a FetchOp for sources other than Client: a fake hands out
// promise.op() and completes it later (or never, to test what must not wait on it).
//
// Thread-safety: as the implementation says (Client: every method is thread-safe). FetchPromise:
// Set may be called from any thread, concurrently with the op's Wait.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "zps/common/dtype.h"
#include "zps/common/layout.h"
#include "zps/common/status.h"
#include "zps/worker/fetch_op.h"

namespace zps::worker {

class ParamSource {
 public:
  virtual ~ParamSource() = default;

  /// The job's parameter layout (ids, element counts). Lives as long as the source.
  virtual const Layout& layout() const = 0;
  /// The dtype fetched buffers hold.
  virtual DType serving_dtype() const = 0;
  /// The serving copy's dtype as the shards keep and send it: serving_dtype(), except for a
  /// block-quantized copy (int8 blocks), whose fetches serving_dtype() says are dequantized.
  virtual DType wire_dtype() const { return serving_dtype(); }
  /// The bound on every single wait, FetchOp::Wait included.
  virtual std::chrono::milliseconds op_timeout() const = 0;
  /// Starts fetching parameter `param` at version >= min_version. Errors are reported by the
  /// returned op's Wait (OutOfRange for a bad id).
  virtual FetchOp FetchAsync(uint32_t param, int64_t min_version) = 0;
  /// Starts fetching elements [begin, begin + length) of `param` (a bandwidth-centric rank's
  /// slice). Errors (by Wait): OutOfRange for a bad id or range.
  virtual FetchOp FetchAsync(uint32_t param, uint64_t begin, uint64_t length,
                             int64_t min_version) = 0;
  /// As the ranged FetchAsync, but the buffer holds the block records of a block-quantized
  /// serving copy as fetched, not dequantized: dtype wire_dtype(), laid out as
  /// QuantizedPieces (zps/worker/quantized_pieces.h) says. Errors (by Wait): as FetchAsync;
  /// FailedPrecondition where wire_dtype() is not block-quantized (the default).
  virtual FetchOp FetchQuantizedAsync(uint32_t param, uint64_t begin, uint64_t length,
                                      int64_t min_version);
};

}  // namespace zps::worker

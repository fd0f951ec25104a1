// zps/worker/fetch_op.h — a fetched parameter buffer, and the handle of a fetch in flight.
//
// Thread-safety: a ParamBuffer is immutable once a FetchOp's Wait returned it. FetchOp's Wait and
// done, and FetchPromise's Set, may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "zps/common/dtype.h"
#include "zps/common/status.h"
#include "zps/worker/device.h"

namespace zps::worker {

/// One run of elements of a quantized ParamBuffer: `elems` elements that start `skip` elements
/// into the first of the block records at bytes [offset, offset + bytes) of the buffer (the
/// covering blocks of one chunk's serving copy, zps/common/serving_quant.h). A buffer's pieces
/// follow each other in element order.
struct QuantPiece {
  uint64_t elems = 0;
  uint64_t skip = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

/// A fetched parameter (or, from a ranged fetch, elements [begin, begin + n) of it): n elements of
/// the serving dtype (bf16, fp16, or fp32: numel x 4 bytes), at `version` or newer. A quantized
/// buffer (dtype kI8Block / kI4Block, from ParamSource::FetchQuantizedAsync) holds instead the
/// serving copy's block records as the shards sent them, described by `pieces`
/// (zps/worker/quantized_pieces.h dequantizes them).
struct ParamBuffer {
  uint32_t param = 0;
  uint64_t begin = 0;  // first element held (0 for a whole parameter; a ranged fetch's begin)
  int64_t version = -1;
  DType dtype = DType::kBF16;
  DeviceBuffer memory;
  std::vector<QuantPiece> pieces;  // quantized buffers only
  std::span<const std::byte> bytes() const { return {memory.data(), memory.size()}; }
};

/// An in-flight fetch. Wait() may be called from any thread, any number of times.
class FetchOp {
 public:
  /// Blocks until every piece arrived or failed, or `timeout`. Errors: from the shards,
  /// Unavailable (peer lost), DeadlineExceeded.
  Result<std::shared_ptr<const ParamBuffer>> Wait(std::chrono::milliseconds timeout);
  bool done() const;
  struct State;
  explicit FetchOp(std::shared_ptr<State> s) : state_(std::move(s)) {}

 private:
  std::shared_ptr<State> state_;
};

/// The completing side of a FetchOp made outside Client (a ParamSource fake, zps/worker/
/// param_source.h): op() stays pending until Set.
class FetchPromise {
 public:
  /// A pending fetch of parameter `param` (named by a DeadlineExceeded from Wait).
  explicit FetchPromise(uint32_t param);
  FetchOp op() const { return FetchOp(state_); }
  /// Completes the op: its Wait returns `buffer` (the version Wait reports is buffer->version),
  /// or `error`. Only the first Set counts; later ones do nothing.
  void Set(std::shared_ptr<ParamBuffer> buffer);
  void Fail(const Status& error);

 private:
  std::shared_ptr<FetchOp::State> state_;
};

}  // namespace zps::worker

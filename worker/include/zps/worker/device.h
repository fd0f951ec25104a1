// zps/worker/device.h — where fetched parameters land. The CPU backend allocates host memory;
// the CUDA backend (zps/worker/cuda_backend.h, target zps::worker_cuda) implements the same
// interface with a fixed pool of pinned host staging slots registered with the Client's UCX
// context, so that UCX receives straight into them.
//
// Thread-safety: Allocate may be called from any thread; AttachUcx/DetachUcx are called by the
// Client that uses the device (at Connect and in its destructor), one Client at a time.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>

#include "zps/common/status.h"

namespace zps::ucx {
class Context;
}

namespace zps::worker {

/// An owned allocation of a Device. Move-only; frees itself with `free_fn` (which may hold
/// state, e.g. a pool to return the memory to).
class DeviceBuffer {
 public:
  using FreeFn = std::function<void(std::byte*)>;
  DeviceBuffer() = default;
  DeviceBuffer(std::byte* data, size_t size, FreeFn free_fn)
      : data_(data, std::move(free_fn)), size_(size) {}
  std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  std::unique_ptr<std::byte, FreeFn> data_{nullptr, [](std::byte*) {}};
  size_t size_ = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string_view name() const = 0;
  /// Memory the data plane can receive into. Errors: ResourceExhausted.
  virtual Result<DeviceBuffer> Allocate(size_t bytes) = 0;
  /// Called by Client::Connect once its UCX context exists: a device may register its memory
  /// with it (ucp_mem_map), so that receives into it need no registration on the fly. The
  /// registrations must be dropped in DetachUcx, which the Client calls before it destroys the
  /// context. Errors: FailedPrecondition (already attached to another Client), from UCX.
  virtual Status AttachUcx(ucx::Context& /*context*/) { return Status::Ok(); }
  virtual void DetachUcx() {}
};

/// Host memory, 64-byte aligned.
class CpuDevice final : public Device {
 public:
  std::string_view name() const override { return "cpu"; }
  Result<DeviceBuffer> Allocate(size_t bytes) override;
  /// A process-wide instance (stateless, so sharing it is safe).
  static CpuDevice* Default();
};

}  // namespace zps::worker

// zps/worker/device.h — where fetched parameters land. The CPU backend allocates host memory;
// a CUDA backend implements the same interface with device (or pinned, registered) memory.
//
// Thread-safety: Allocate may be called from any thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>

#include "zps/common/status.h"

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

// zps/worker/device.h — where fetched parameters land. The CPU backend allocates host memory;
// a CUDA backend implements the same interface with device (or pinned, registered) memory.
//
// Thread-safety: Allocate may be called from any thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "zps/common/status.h"

namespace zps::worker {

/// An owned allocation of a Device. Move-only; frees itself.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(std::byte* data, size_t size, void (*free_fn)(std::byte*))
      : data_(data, free_fn), size_(size) {}
  std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  std::unique_ptr<std::byte, void (*)(std::byte*)> data_{nullptr, [](std::byte*) {}};
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

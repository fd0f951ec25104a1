#include "zps/worker/device.h"

#include <cstdlib>
#include <string>

namespace zps::worker {

Result<DeviceBuffer> CpuDevice::Allocate(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) return ResourceExhausted("cannot allocate " + std::to_string(bytes) + " bytes");
  return DeviceBuffer(static_cast<std::byte*>(p), bytes, [](std::byte* q) { std::free(q); });
}

CpuDevice* CpuDevice::Default() {
  static CpuDevice device;
  return &device;
}

}  // namespace zps::worker

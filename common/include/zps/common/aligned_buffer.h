// zps/common/aligned_buffer.h — an owned, zero-initialised, 64-byte aligned array.
//
// Thread-safety: a value; concurrent reads are safe, writes need external synchronisation.
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>

#include "zps/common/status.h"

namespace zps {

template <typename T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  /// Errors: ResourceExhausted when the allocation fails.
  static Result<AlignedBuffer> Allocate(size_t n) {
    AlignedBuffer b;
    if (n == 0) return b;
    size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) {
      return ResourceExhausted("cannot allocate " + std::to_string(bytes) + " bytes");
    }
    std::memset(p, 0, bytes);
    b.data_.reset(static_cast<T*>(p));
    b.size_ = n;
    return b;
  }
  /// As Allocate, without zeroing: the contents are unspecified (for buffers about to be
  /// overwritten entirely). Errors: ResourceExhausted.
  static Result<AlignedBuffer> AllocateUninitialized(size_t n) {
    AlignedBuffer b;
    if (n == 0) return b;
    size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) {
      return ResourceExhausted("cannot allocate " + std::to_string(bytes) + " bytes");
    }
    b.data_.reset(static_cast<T*>(p));
    b.size_ = n;
    return b;
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t size() const { return size_; }
  std::span<T> span() { return {data_.get(), size_}; }
  std::span<const T> span() const { return {data_.get(), size_}; }
  T& operator[](size_t i) { return data_.get()[i]; }
  const T& operator[](size_t i) const { return data_.get()[i]; }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  size_t size_ = 0;
};

}  // namespace zps

// zps/common/aligned_buffer.h — an owned, zero-initialised, 64-byte aligned array (2 MiB
// aligned, on transparent huge pages where the kernel grants them, from kHugePageMin bytes).
//
// Thread-safety: a value; concurrent reads are safe, writes need external synchronisation.
#pragma once

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <utility>

#include "zps/common/status.h"

namespace zps {

template <typename T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  /// A moved-from buffer is empty (size() 0, data() null), as a default-made one: code that
  /// hands a buffer away and later asks its size must not see the old one.
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::move(o.data_)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    data_ = std::move(o.data_);
    size_ = std::exchange(o.size_, 0);
    return *this;
  }
  /// Errors: ResourceExhausted when the allocation fails.
  static Result<AlignedBuffer> Allocate(size_t n) { return Make(n, /*zero=*/true); }
  /// As Allocate, without zeroing: the contents are unspecified (for buffers about to be
  /// overwritten entirely). Errors: ResourceExhausted.
  static Result<AlignedBuffer> AllocateUninitialized(size_t n) { return Make(n, /*zero=*/false); }

  /// Buffers of this many bytes and more are 2 MiB aligned and advised for transparent huge
  /// pages (madvise MADV_HUGEPAGE: a hint, a no-op where THP is off or "never"). The
  /// optimizer's passes stream 5-8 such arrays at once; with 4 KiB pages each stream takes a
  /// TLB miss every 4 KiB (docs/benchmarks.md, "Huge pages").
  static constexpr size_t kHugePageMin = size_t{4} << 20;
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t size() const { return size_; }
  std::span<T> span() { return {data_.get(), size_}; }
  std::span<const T> span() const { return {data_.get(), size_}; }
  T& operator[](size_t i) { return data_.get()[i]; }
  const T& operator[](size_t i) const { return data_.get()[i]; }

 private:
  static Result<AlignedBuffer> Make(size_t n, bool zero) {
    AlignedBuffer b;
    if (n == 0) return b;
    constexpr size_t kHuge = size_t{2} << 20;
    const bool huge = n * sizeof(T) >= kHugePageMin;
    const size_t align = huge ? kHuge : 64;
    const size_t bytes = (n * sizeof(T) + align - 1) / align * align;
    void* p = std::aligned_alloc(align, bytes);
    if (p == nullptr) {
      return ResourceExhausted("cannot allocate " + std::to_string(bytes) + " bytes");
    }
    if (huge) (void)::madvise(p, bytes, MADV_HUGEPAGE);  // before the first touch
    if (zero) std::memset(p, 0, bytes);
    b.data_.reset(static_cast<T*>(p));
    b.size_ = n;
    return b;
  }
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  size_t size_ = 0;
};

}  // namespace zps

// zps/common/bytes.h — little-endian encoding into byte buffers, and bounds-checked decoding.
//
// ByteReader never reads past its span: every getter returns a Result, and a short buffer is an
// InvalidArgument error naming the field. This is the only way zps decodes untrusted bytes
// (frames from the network, values from files).
//
// Thread-safety: value types; one instance per thread.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zps/common/status.h"

namespace zps {

class ByteWriter {
 public:
  ByteWriter() = default;
  explicit ByteWriter(std::vector<std::byte> buf) : buf_(std::move(buf)) {}

  void U8(uint8_t v) { Raw(&v, 1); }
  void U16(uint16_t v) { Raw(&v, 2); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void I64(int64_t v) { Raw(&v, 8); }
  void F32(float v) { Raw(&v, 4); }
  void F64(double v) { Raw(&v, 8); }
  /// u32 length, then the bytes.
  void Str(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    Raw(s.data(), s.size());
  }
  void Blob(std::span<const std::byte> b) {
    U32(static_cast<uint32_t>(b.size()));
    Raw(b.data(), b.size());
  }
  void Raw(const void* p, size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  size_t size() const { return buf_.size(); }
  std::vector<std::byte>& buffer() { return buf_; }
  std::vector<std::byte> Take() { return std::move(buf_); }

 private:
  static_assert(std::endian::native == std::endian::little, "zps encodes little-endian");
  std::vector<std::byte> buf_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const std::byte> data) : data_(data) {}

  Result<uint8_t> U8(std::string_view field) { return Get<uint8_t>(field); }
  Result<uint16_t> U16(std::string_view field) { return Get<uint16_t>(field); }
  Result<uint32_t> U32(std::string_view field) { return Get<uint32_t>(field); }
  Result<uint64_t> U64(std::string_view field) { return Get<uint64_t>(field); }
  Result<int64_t> I64(std::string_view field) { return Get<int64_t>(field); }
  Result<float> F32(std::string_view field) { return Get<float>(field); }
  Result<double> F64(std::string_view field) { return Get<double>(field); }
  /// A u32-length-prefixed string of at most `max_len` bytes.
  Result<std::string> Str(std::string_view field, size_t max_len) {
    ZPS_ASSIGN_OR_RETURN(auto b, Blob(field, max_len));
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  /// A u32-length-prefixed byte run of at most `max_len` bytes (a view into the input).
  Result<std::span<const std::byte>> Blob(std::string_view field, size_t max_len) {
    ZPS_ASSIGN_OR_RETURN(uint32_t n, U32(field));
    if (n > max_len) {
      return InvalidArgument(std::string(field) + ": length " + std::to_string(n) +
                             " exceeds the bound " + std::to_string(max_len));
    }
    return Take(field, n);
  }
  Result<std::span<const std::byte>> Take(std::string_view field, size_t n) {
    if (n > remaining()) return Short(field);
    auto s = data_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  size_t remaining() const { return data_.size() - pos_; }
  /// Errors: InvalidArgument if bytes are left over (a frame longer than its message).
  Status ExpectEnd(std::string_view what) const {
    if (remaining() != 0) {
      return InvalidArgument(std::string(what) + ": " + std::to_string(remaining()) +
                             " unexpected trailing bytes");
    }
    return Status::Ok();
  }

 private:
  Status Short(std::string_view field) const {
    return InvalidArgument("truncated input while reading '" + std::string(field) + "'");
  }
  template <typename T>
  Result<T> Get(std::string_view field) {
    if (sizeof(T) > remaining()) return Short(field);
    T v;
    std::memcpy(&v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::span<const std::byte> data_;
  size_t pos_ = 0;
};

}  // namespace zps

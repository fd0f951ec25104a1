// zps/worker/coordinator_kv.h — a client of the coordinator's key-value rendezvous store (KvSet /
// KvGet, docs/protocol.md "Key-value rendezvous"): what a collectives communicator (Gloo's
// rendezvous::Store) is built on, so that workers need nothing but ZPS_ENDPOINT and the token.
//
//   auto kv = zps::worker::CoordinatorKv::Connect({.endpoint = "host:7070", .token = t});
//   (*kv)->Set("gloo/0/rank1", bytes);
//   auto v = (*kv)->Get("gloo/0/rank0", std::chrono::seconds(30));   // waits until set
//
// A CoordinatorKv pins the store's generation (the coordinator's epoch + 1) at its first call:
// once the job recovers (a shard lost, a rollback), every later call fails with Unavailable, and
// the caller builds a new communicator with a new CoordinatorKv.
//
// Thread-safety: every method is thread-safe (calls may be outstanding together). Owns one
// control-plane connection (role tool); no global state.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zps/common/status.h"

namespace zps::rpc {
class Client;
}

namespace zps::worker {

struct CoordinatorKvOptions {
  std::string endpoint;  // Default: none. host:port of the coordinator (ZPS_ENDPOINT).
  std::string token;     // Default: none. The shared auth secret.
  uint32_t rank = 0;     // Default: 0. Only for the coordinator's logs.
  std::chrono::milliseconds connect_timeout{60000};  // Default: 60 s to reach the coordinator.
};

class CoordinatorKv {
 public:
  /// Connects to the coordinator (retrying until connect_timeout). Errors: InvalidArgument
  /// (endpoint), Unavailable (unreachable), Unauthenticated (token).
  static Result<std::unique_ptr<CoordinatorKv>> Connect(const CoordinatorKvOptions& options);
  ~CoordinatorKv();
  CoordinatorKv(const CoordinatorKv&) = delete;
  CoordinatorKv& operator=(const CoordinatorKv&) = delete;

  /// Sets `key` (1..512 bytes) to `value` (at most 4 MiB). Errors: InvalidArgument (sizes),
  /// ResourceExhausted (the store's bounds), Unavailable (the generation ended, the coordinator
  /// lost), DeadlineExceeded.
  Status Set(const std::string& key, std::span<const std::byte> value);
  /// The value of `key`, waiting up to `wait` (at most 10 min) until some rank sets it.
  /// Errors: DeadlineExceeded (not set in time), Unavailable (generation ended, coordinator
  /// lost), InvalidArgument.
  Result<std::vector<std::byte>> Get(const std::string& key, std::chrono::milliseconds wait);
  /// The pinned generation (0 before the first call).
  uint64_t generation() const { return generation_.load(); }

 private:
  explicit CoordinatorKv(std::unique_ptr<rpc::Client> c, std::string endpoint);
  Status Pin(uint64_t served);
  std::unique_ptr<rpc::Client> rpc_;
  std::string endpoint_;
  std::atomic<uint64_t> generation_{0};
};

}  // namespace zps::worker

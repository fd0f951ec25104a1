// KvService — the coordinator's key-value rendezvous calls (docs/protocol.md, "Key-value
// rendezvous"), apart from the wire: the generation a request names is resolved against the
// coordinator (the store follows its worker generation; nothing is served while the job
// recovers), then the KvStore answers. kv_rpc_service.cc registers each as a one-line handler.
//
// Thread-safety: every method is thread-safe (the Coordinator and KvStore are).
#pragma once

#include <cstdint>
#include <functional>

#include "zps/common/messages.h"
#include "zps/common/status.h"
#include "zps/server/coordinator.h"
#include "zps/server/kv_store.h"

namespace zps::server {

class KvService {
 public:
  using Done = std::function<void(const Result<msg::KvReply>&)>;

  /// Not owned; both must outlive the service.
  KvService(Coordinator* coordinator, KvStore* kv) : c_(coordinator), kv_(kv) {}

  /// The generation a request names (0 = the current one), after moving the store to the
  /// coordinator's worker generation. Errors: the coordinator's stop reason; Unavailable while
  /// the job recovers.
  Result<uint64_t> Generation(uint64_t asked);
  /// kKvSet: the reply names the generation that took the value (its value is empty).
  /// Errors: as Generation; from KvStore::Set.
  Result<msg::KvReply> Set(msg::KvSet m);
  /// kKvGet: answered with the value, once there or after m.wait_ms. Errors: as Generation;
  /// from KvStore::Get.
  void Get(const msg::KvGet& m, Done done);

 private:
  Coordinator* c_;
  KvStore* kv_;
};

}  // namespace zps::server

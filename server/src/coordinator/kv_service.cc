#include "coordinator/kv_service.h"

#include <chrono>
#include <utility>
#include <vector>

namespace zps::server {

Result<uint64_t> KvService::Generation(uint64_t asked) {
  ZPS_RETURN_IF_ERROR(c_->stopped());
  if (c_->phase() == msg::JobPhase::kRecovering) {
    return Unavailable("the job is recovering; rendezvous again after re-joining");
  }
  kv_->Advance(c_->kv_generation());
  return asked == 0 ? kv_->generation() : asked;
}

Result<msg::KvReply> KvService::Set(msg::KvSet m) {
  ZPS_ASSIGN_OR_RETURN(uint64_t g, Generation(m.generation));
  ZPS_RETURN_IF_ERROR(kv_->Set(g, m.key, std::move(m.value)));
  return msg::KvReply{g, {}};
}

void KvService::Get(const msg::KvGet& m, Done done) {
  auto g = Generation(m.generation);
  if (!g.ok()) return done(g.status());
  kv_->Get(*g, m.key, std::chrono::milliseconds(m.wait_ms),
           [g = *g, done = std::move(done)](const Result<std::vector<std::byte>>& v) {
             if (!v.ok()) return done(v.status());
             done(msg::KvReply{g, *v});
           });
}

}  // namespace zps::server

#include "zps/worker/coordinator_kv.h"

#include <thread>

#include "zps/common/config.h"
#include "zps/common/messages.h"
#include "zps/common/rpc.h"

namespace zps::worker {

using namespace std::chrono_literals;

CoordinatorKv::CoordinatorKv(std::unique_ptr<rpc::Client> c, std::string endpoint)
    : rpc_(std::move(c)), endpoint_(std::move(endpoint)) {}

CoordinatorKv::~CoordinatorKv() = default;

Result<std::unique_ptr<CoordinatorKv>> CoordinatorKv::Connect(const CoordinatorKvOptions& o) {
  if (o.endpoint.empty()) return InvalidArgument("no coordinator endpoint (ZPS_ENDPOINT)");
  ZPS_ASSIGN_OR_RETURN(auto hp, SplitHostPort(o.endpoint));
  const auto deadline = std::chrono::steady_clock::now() + o.connect_timeout;
  Status last = Unavailable("no attempt");
  auto backoff = 50ms;
  do {
    rpc::ClientOptions co{
        hp.first, hp.second, o.token, rpc::PeerRole::kTool, o.rank, "kv-" + std::to_string(o.rank),
        {},       5000};
    auto c = rpc::Client::Connect(co);
    if (c.ok()) return std::unique_ptr<CoordinatorKv>(new CoordinatorKv(std::move(*c), o.endpoint));
    last = c.status();
    if (last.code() != Code::kUnavailable && last.code() != Code::kDeadlineExceeded) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  } while (std::chrono::steady_clock::now() < deadline);
  return last.WithContext("coordinator at " + o.endpoint);
}

Status CoordinatorKv::Pin(uint64_t served) {
  uint64_t expected = 0;
  if (generation_.compare_exchange_strong(expected, served) || expected == served) {
    return Status::Ok();
  }
  return Unavailable("the coordinator's kv generation moved from " + std::to_string(expected) +
                     " to " + std::to_string(served) + " (the job recovered)");
}

Status CoordinatorKv::Set(const std::string& key, std::span<const std::byte> value) {
  msg::KvSet m{generation_.load(), key, {value.begin(), value.end()}};
  if (key.empty() || key.size() > msg::kMaxKvKeyBytes || value.size() > msg::kMaxKvValueBytes) {
    return InvalidArgument("kv set: key of " + std::to_string(key.size()) + " bytes, value of " +
                           std::to_string(value.size()));
  }
  auto r = rpc_->Call(msg::kKvSet, m.Encode(), 30s);
  if (!r.ok()) return r.status().WithContext("kv set '" + key + "' at " + endpoint_);
  ZPS_ASSIGN_OR_RETURN(auto reply, msg::KvReply::Decode(*r));
  return Pin(reply.generation);
}

Result<std::vector<std::byte>> CoordinatorKv::Get(const std::string& key,
                                                  std::chrono::milliseconds wait) {
  if (wait.count() < 0 || wait.count() > msg::kMaxKvWaitMs) {
    return InvalidArgument("kv get: a wait of " + std::to_string(wait.count()) + " ms");
  }
  if (key.empty() || key.size() > msg::kMaxKvKeyBytes) {
    return InvalidArgument("kv get: key of " + std::to_string(key.size()) + " bytes");
  }
  msg::KvGet m{generation_.load(), key, static_cast<uint32_t>(wait.count())};
  auto r = rpc_->Call(msg::kKvGet, m.Encode(), wait + 30s);
  if (!r.ok()) return r.status().WithContext("kv get '" + key + "' at " + endpoint_);
  ZPS_ASSIGN_OR_RETURN(auto reply, msg::KvReply::Decode(*r));
  ZPS_RETURN_IF_ERROR(Pin(reply.generation));
  return std::move(reply.value);
}

}  // namespace zps::worker

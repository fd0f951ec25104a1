#include "zps/worker/gloo_collectives.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <vector>

#include "zps/common/logging.h"
#include "zps/common/thread_annotations.h"
#include "zps/worker/coordinator_kv.h"

namespace zps::worker {

namespace {

// gloo::rendezvous::Store over the coordinator's kv. Gloo expects exceptions from a store: a
// failed call records its Status (GlooCall reports that one, not the exception's text) and throws.
class KvStoreAdapter final : public gloo::rendezvous::Store {
 public:
  KvStoreAdapter(CoordinatorKv* kv, std::string prefix, std::chrono::milliseconds timeout)
      : kv_(kv), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    auto bytes = std::as_bytes(std::span<const char>(data));
    Check(kv_->Set(prefix_ + "/" + key, bytes));
  }
  std::vector<char> get(const std::string& key) override {
    auto v = kv_->Get(prefix_ + "/" + key, timeout_);
    Check(v.status());
    const auto* p = reinterpret_cast<const char*>(v->data());
    return std::vector<char>(p, p + v->size());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  // The base class ignores the timeout: every wait here is bounded.
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto bound = std::min(timeout, timeout_);
    for (const auto& k : keys) Check(kv_->Get(prefix_ + "/" + k, bound).status());
  }

  Status last_error() {
    MutexLock lock(&mu_);
    return error_;
  }

 private:
  void Check(const Status& s) {
    if (s.ok()) return;
    {
      MutexLock lock(&mu_);
      if (error_.ok()) error_ = s;
    }
    throw gloo::IoException("rendezvous: " + s.ToString());
  }
  CoordinatorKv* kv_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
  Mutex mu_;
  Status error_ GUARDED_BY(mu_);  // the first failed kv call
};

// The one place a Gloo failure becomes a Status: runs f, catching what Gloo throws.
template <typename F>
Status GlooCall(const char* what, KvStoreAdapter* store, F&& f) {
  try {
    f();
    return Status::Ok();
  } catch (const gloo::IoException& e) {
    Status s = store != nullptr ? store->last_error() : Status::Ok();
    if (s.ok()) {
      const std::string m = e.what();
      s = m.find("Timed out") != std::string::npos || m.find("timed out") != std::string::npos
              ? DeadlineExceeded(m)
              : Unavailable(m);
    }
    ZPS_LOG(WARNING) << "gloo " << what << ": " << s.ToString();
    return s.WithContext(std::string("gloo ") + what);
  } catch (const gloo::Exception& e) {
    ZPS_LOG(WARNING) << "gloo " << what << ": " << e.what();
    return Internal(std::string("gloo ") + what + ": " + e.what());
  } catch (const std::exception& e) {
    ZPS_LOG(WARNING) << "gloo " << what << ": " << e.what();
    return Internal(std::string("gloo ") + what + ": " + e.what());
  }
}

constexpr uint64_t kMaxGlooCount = 0x7fffffff;

// Gloo's tcp pairs write with writev, which raises SIGPIPE once a peer has closed its end (a rank
// that died): left at its default, that signal ends this process without a word, before the
// write's EPIPE could become the collective's error. Ignored here unless the program chose a
// disposition of its own; sigaction(2) is process-wide and safe to call from any thread.
void IgnoreSigpipeIfDefault() {
  struct sigaction now = {};
  if (::sigaction(SIGPIPE, nullptr, &now) != 0 || now.sa_handler != SIG_DFL ||
      (now.sa_flags & SA_SIGINFO) != 0) {
    return;
  }
  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  if (::sigaction(SIGPIPE, &ignore, nullptr) == 0) {
    ZPS_LOG(DEBUG) << "gloo: SIGPIPE ignored (a write to a closed peer fails with EPIPE)";
  }
}

}  // namespace

struct GlooCollectives::Impl {
  GlooOptions opts;
  std::unique_ptr<CoordinatorKv> kv;
  std::unique_ptr<KvStoreAdapter> store;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::vector<float> scratch;  // padding for counts not divisible by the world size
  uint32_t tag = 0;            // distinct per op: Gloo matches unbound buffers by tag
};

GlooCollectives::GlooCollectives(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

GlooCollectives::~GlooCollectives() {
  // A barrier first, so that no rank closes its pairs while a peer still reads the last message
  // of a collective from them ("Connection closed by peer" there: seen with reduce-scatter at
  // world size 3). Bounded, and only a best effort: a peer already gone fails it at once.
  if (impl_->context && impl_->opts.world_size > 1) {
    try {
      gloo::BarrierOptions o(impl_->context);
      o.setTag(impl_->tag++);
      o.setTimeout(
          std::min<std::chrono::milliseconds>(impl_->opts.timeout, std::chrono::seconds(10)));
      gloo::barrier(o);
    } catch (const std::exception& e) {
      ZPS_LOG(DEBUG) << "gloo: closing barrier: " << e.what();
    }
  }
  // The context (pairs) before the device, both before the store they rendezvoused through.
  impl_->context.reset();
  impl_->device.reset();
}

Result<std::unique_ptr<GlooCollectives>> GlooCollectives::Create(const GlooOptions& options) {
  if (options.world_size == 0 || options.rank >= options.world_size) {
    return InvalidArgument("gloo: rank " + std::to_string(options.rank) + " of world size " +
                           std::to_string(options.world_size));
  }
  if (options.prefix.empty()) return InvalidArgument("gloo: empty rendezvous prefix");
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  if (options.world_size > 1) {
    IgnoreSigpipeIfDefault();
    ZPS_ASSIGN_OR_RETURN(impl->kv, CoordinatorKv::Connect({.endpoint = options.endpoint,
                                                           .token = options.token,
                                                           .rank = options.rank,
                                                           .connect_timeout = options.timeout}));
    impl->store = std::make_unique<KvStoreAdapter>(impl->kv.get(), options.prefix, options.timeout);
    Impl* d = impl.get();
    ZPS_RETURN_IF_ERROR(GlooCall("rendezvous", d->store.get(), [d] {
      gloo::transport::tcp::attr attr;
      attr.hostname = d->opts.hostname;
      d->device = gloo::transport::tcp::CreateDevice(attr);
      d->context = std::make_shared<gloo::rendezvous::Context>(
          static_cast<int>(d->opts.rank), static_cast<int>(d->opts.world_size));
      d->context->setTimeout(d->opts.timeout);
      d->context->connectFullMesh(*d->store, d->device);
    }));
  }
  return std::unique_ptr<GlooCollectives>(new GlooCollectives(std::move(impl)));
}

uint32_t GlooCollectives::rank() const { return impl_->opts.rank; }
uint32_t GlooCollectives::world_size() const { return impl_->opts.world_size; }

Status GlooCollectives::ReduceScatter(std::span<float> inout) {
  const uint32_t world = impl_->opts.world_size;
  if (world == 1 || inout.empty()) return Status::Ok();
  const uint64_t n = inout.size();
  const uint64_t padded = PaddedCount(n, world);
  if (padded > kMaxGlooCount) {
    return InvalidArgument("reduce-scatter of " + std::to_string(n) + " elements (at most 2^31-1)");
  }
  // Equal slices of a padded buffer: Gloo then sees counts divisible by the world size.
  float* buf = inout.data();
  if (padded != n) {
    impl_->scratch.assign(padded, 0.0f);
    std::memcpy(impl_->scratch.data(), inout.data(), n * sizeof(float));
    buf = impl_->scratch.data();
  }
  const uint64_t s = padded / world;
  Impl* d = impl_.get();
  ZPS_RETURN_IF_ERROR(GlooCall("reduce-scatter", d->store.get(), [&] {
    std::vector<int> recv(world, static_cast<int>(s));
    gloo::ReduceScatterHalvingDoubling<float> rs(d->context, {buf}, static_cast<int>(padded), recv);
    rs.run();
  }));
  // The algorithm leaves this rank's reduced slice at the start of the buffer.
  const SliceRange mine = RankSlice(n, world, d->opts.rank);
  if (mine.length > 0) std::memmove(inout.data() + mine.begin, buf, mine.length * sizeof(float));
  return Status::Ok();
}

Status GlooCollectives::AllGather(std::span<std::byte> inout, size_t block_bytes) {
  const uint32_t world = impl_->opts.world_size;
  if (inout.size() != block_bytes * world) {
    return InvalidArgument("all-gather: " + std::to_string(inout.size()) + " bytes, expected " +
                           std::to_string(world) + " blocks of " + std::to_string(block_bytes));
  }
  if (world == 1 || block_bytes == 0) return Status::Ok();
  Impl* d = impl_.get();
  return GlooCall("all-gather", d->store.get(), [&] {
    gloo::AllgatherOptions o(d->context);
    // In place: no input buffer, this rank's block is already where the output wants it.
    o.setOutput(reinterpret_cast<uint8_t*>(inout.data()), inout.size());
    o.setTag(d->tag++);
    o.setTimeout(d->opts.timeout);
    gloo::allgather(o);
  });
}

Status GlooCollectives::AllReduce(std::span<float> inout) {
  const uint32_t world = impl_->opts.world_size;
  if (world == 1 || inout.empty()) return Status::Ok();
  Impl* d = impl_.get();
  return GlooCall("all-reduce", d->store.get(), [&] {
    gloo::AllreduceOptions o(d->context);
    o.setOutput(inout.data(), inout.size());
    o.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    o.setTag(d->tag++);
    o.setTimeout(d->opts.timeout);
    gloo::allreduce(o);
  });
}

}  // namespace zps::worker

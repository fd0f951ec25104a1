#include "zps/worker/bucket_reducer.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <string>
#include <thread>

#include "zps/common/logging.h"
#include "zps/common/thread_annotations.h"
#include "zps/worker/checked_collectives.h"

namespace zps::worker {

namespace {

struct Bucket {
  std::vector<uint32_t> params;  // consecutive trainable ids
  std::vector<uint64_t> offset;  // each one's offset in the bucket
  uint64_t elems = 0;
};

// The state of one (step, micro) on the training thread.
struct Generation {
  int64_t step = -1;
  uint32_t micro = 0;
  bool active = false;
  std::vector<std::vector<float>> buffers;  // per bucket: empty until its first gradient
  std::vector<uint32_t> missing;            // per bucket: parameters without a gradient yet
  std::vector<char> have;                   // per parameter: added
  uint32_t next = 0;                        // next bucket (in reduce order) to queue
};

struct Item {
  int64_t step;
  uint32_t micro;
  uint32_t order;  // position in the reduce order
  std::vector<float> data;
};

}  // namespace

struct BucketReducer::Impl {
  const Layout* layout = nullptr;
  std::vector<char> frozen;
  std::vector<Bucket> buckets;          // in reduce order
  std::vector<uint32_t> bucket_of;      // per parameter: its position in the reduce order
  std::vector<uint32_t> pos_in_bucket;  // per parameter
  std::unique_ptr<CheckedCollectives> comm;
  Push push;
  BucketReducerOptions opts;
  // Lock order: gen_mu, then mu. gen_mu only serialises callers (zps.torch pushes from the
  // autograd thread of a CUDA backward, and flushes from the training thread).
  Mutex gen_mu;
  Generation gen GUARDED_BY(gen_mu);

  Mutex mu;
  CondVar cv;
  std::deque<Item> queue GUARDED_BY(mu);
  bool busy GUARDED_BY(mu) = false;
  bool stop GUARDED_BY(mu) = false;
  Status error GUARDED_BY(mu);
  BucketReducerStats stats GUARDED_BY(mu);
  std::thread thread;

  std::string Describe(uint32_t order) const {
    const Bucket& b = buckets[order];
    std::string s = "bucket " + std::to_string(order) + " (params " +
                    std::to_string(b.params.front()) + "-" + std::to_string(b.params.back()) + ":";
    for (size_t i = 0; i < b.params.size() && i < 3; ++i) {
      s += " " + layout->spec(b.params[i]).name;
    }
    if (b.params.size() > 3) s += " ...";
    return s + ")";
  }

  Status Sticky() {
    MutexLock lock(&mu);
    return error;
  }

  void Enqueue(uint32_t order, bool early) REQUIRES(gen_mu) {
    Item it{gen.step, gen.micro, order, std::move(gen.buffers[order])};
    if (it.data.empty()) it.data.assign(buckets[order].elems, 0.0f);
    gen.buffers[order] = {};
    MutexLock lock(&mu);
    if (early) ++stats.buckets_early;
    queue.push_back(std::move(it));
    cv.SignalAll();
  }

  // Queues complete buckets in the reduce order, stopping at the first incomplete one.
  void QueueReady(bool early) REQUIRES(gen_mu) {
    while (gen.next < buckets.size() && gen.missing[gen.next] == 0) Enqueue(gen.next++, early);
  }

  bool Done() const REQUIRES(gen_mu) { return !gen.active || gen.next == buckets.size(); }

  void Start(int64_t step, uint32_t micro) REQUIRES(gen_mu) {
    gen.step = step;
    gen.micro = micro;
    gen.active = true;
    gen.next = 0;
    gen.buffers.assign(buckets.size(), {});
    gen.missing.resize(buckets.size());
    for (size_t b = 0; b < buckets.size(); ++b) {
      gen.missing[b] = static_cast<uint32_t>(buckets[b].params.size());
    }
    gen.have.assign(layout->num_params(), 0);
  }

  Status FinishLocked() REQUIRES(gen_mu) {
    ZPS_RETURN_IF_ERROR(Sticky());
    if (Done()) return Status::Ok();
    uint64_t zeros = 0;
    for (uint32_t o = gen.next; o < buckets.size(); ++o) {
      for (uint32_t p : buckets[o].params) zeros += gen.have[p] ? 0 : 1;
      gen.missing[o] = 0;  // the buffer's zeros stand for the missing gradients
    }
    {
      MutexLock lock(&mu);
      stats.zero_filled += zeros;
    }
    QueueReady(/*early=*/false);
    return Status::Ok();
  }

  Status Reduce(Item& it) {
    const Bucket& b = buckets[it.order];
    if (static_cast<int64_t>(it.order) == opts.skip_bucket &&
        (opts.skip_step < 0 || (it.step == opts.skip_step && it.micro == 0))) {
      ZPS_LOG(WARNING) << "test hook: skipping the reduce-scatter of " << Describe(it.order);
      return Status::Ok();
    }
    ZPS_RETURN_IF_ERROR(comm->ReduceScatter(it.order, it.data));
    const SliceRange mine = RankSlice(b.elems, comm->world_size(), comm->rank());
    const uint64_t end = mine.begin + mine.length;
    for (size_t i = 0; i < b.params.size(); ++i) {
      const uint64_t pb = b.offset[i], pe = pb + layout->param_numel(b.params[i]);
      const uint64_t lo = std::max(pb, mine.begin), hi = std::min(pe, end);
      if (lo >= hi) continue;
      ZPS_RETURN_IF_ERROR(
          push(b.params[i], it.step, lo - pb, {it.data.data() + lo, hi - lo}, it.micro));
    }
    return Status::Ok();
  }

  void Loop() {
    log::SetThreadName("zps-reduce");
    while (true) {
      Item it;
      {
        MutexLock lock(&mu);
        cv.Wait(lock, [&]() REQUIRES(mu) { return stop || !queue.empty(); });
        if (stop) return;
        it = std::move(queue.front());
        queue.pop_front();
        busy = true;
        if (!error.ok()) {  // the communicator is unusable: drop what is queued
          busy = false;
          cv.SignalAll();
          continue;
        }
      }
      Status s = Reduce(it);
      MutexLock lock(&mu);
      busy = false;
      if (s.ok()) {
        ++stats.buckets_reduced;
      } else if (error.ok()) {
        error = s;
      }
      cv.SignalAll();
    }
  }
};

BucketReducer::BucketReducer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

BucketReducer::~BucketReducer() {
  {
    MutexLock lock(&impl_->mu);
    impl_->stop = true;
    impl_->cv.SignalAll();
  }
  if (impl_->thread.joinable()) impl_->thread.join();
}

Result<std::unique_ptr<BucketReducer>> BucketReducer::Create(const Layout& layout,
                                                             std::span<const uint8_t> frozen,
                                                             Collectives* comm, Push push,
                                                             const BucketReducerOptions& options) {
  const uint32_t n = layout.num_params();
  if (!frozen.empty() && frozen.size() != n) {
    return InvalidArgument("frozen has " + std::to_string(frozen.size()) + " entries for " +
                           std::to_string(n) + " parameters");
  }
  if (options.bucket_bytes == 0) return InvalidArgument("bucket_bytes is 0");
  auto impl = std::make_unique<Impl>();
  impl->layout = &layout;
  impl->frozen.assign(n, 0);
  for (size_t i = 0; i < frozen.size(); ++i) impl->frozen[i] = frozen[i] != 0;
  impl->push = std::move(push);
  impl->opts = options;
  // Buckets in layout order, then reversed: the reduce order.
  const uint64_t cap = std::max<uint64_t>(1, options.bucket_bytes / sizeof(float));
  std::vector<Bucket> forward;
  for (uint32_t p = 0; p < n; ++p) {
    if (impl->frozen[p]) continue;
    const uint64_t numel = layout.param_numel(p);
    if (forward.empty() || forward.back().elems + numel > cap) forward.emplace_back();
    Bucket& b = forward.back();
    b.params.push_back(p);
    b.offset.push_back(b.elems);
    b.elems += numel;
  }
  impl->buckets.assign(forward.rbegin(), forward.rend());
  impl->bucket_of.assign(n, 0);
  impl->pos_in_bucket.assign(n, 0);
  for (uint32_t o = 0; o < impl->buckets.size(); ++o) {
    const Bucket& b = impl->buckets[o];
    for (uint32_t i = 0; i < b.params.size(); ++i) {
      impl->bucket_of[b.params[i]] = o;
      impl->pos_in_bucket[b.params[i]] = i;
    }
  }
  Impl* d = impl.get();
  impl->comm = std::make_unique<CheckedCollectives>(
      comm, [d](const CollectiveOp& op) { return d->Describe(op.id); });
  impl->thread = std::thread([d] { d->Loop(); });
  return std::unique_ptr<BucketReducer>(new BucketReducer(std::move(impl)));
}

Status BucketReducer::Add(uint32_t param, int64_t step, uint32_t micro,
                          std::span<const float> grad) {
  Impl& d = *impl_;
  ZPS_RETURN_IF_ERROR(d.Sticky());
  if (param >= d.layout->num_params()) return OutOfRange("parameter id " + std::to_string(param));
  MutexLock lock(&d.gen_mu);
  const std::string& name = d.layout->spec(param).name;
  if (d.frozen[param]) return InvalidArgument("parameter " + name + " is frozen");
  if (grad.size() != d.layout->param_numel(param)) {
    return InvalidArgument("gradient of " + name + " has " + std::to_string(grad.size()) +
                           " elements, expected " + std::to_string(d.layout->param_numel(param)));
  }
  Generation& g = d.gen;
  if (!g.active || g.step != step || g.micro != micro) {
    ZPS_RETURN_IF_ERROR(d.FinishLocked());  // the previous micro-batch is over: zeros for the rest
    d.Start(step, micro);
  }
  if (g.have[param]) {
    return AlreadyExists("parameter " + name + " got a second gradient in step " +
                         std::to_string(step) + " micro " + std::to_string(micro));
  }
  const uint32_t o = d.bucket_of[param];
  if (o < g.next) {
    return Internal("bucket of " + name + " was queued before its gradient");  // cannot happen
  }
  const Bucket& b = d.buckets[o];
  if (g.buffers[o].empty()) g.buffers[o].assign(b.elems, 0.0f);
  std::memcpy(g.buffers[o].data() + b.offset[d.pos_in_bucket[param]], grad.data(),
              grad.size_bytes());
  g.have[param] = 1;
  --g.missing[o];
  d.QueueReady(/*early=*/true);
  return Status::Ok();
}

Status BucketReducer::Finish() {
  MutexLock lock(&impl_->gen_mu);
  return impl_->FinishLocked();
}

Status BucketReducer::Drain() {
  Impl& d = *impl_;
  MutexLock lock(&d.mu);
  d.cv.Wait(lock, [&]() REQUIRES(d.mu) { return d.queue.empty() && !d.busy; });
  return d.error;
}

uint32_t BucketReducer::num_buckets() const { return static_cast<uint32_t>(impl_->buckets.size()); }

BucketReducerStats BucketReducer::stats() const {
  MutexLock lock(&impl_->mu);
  return impl_->stats;
}

}  // namespace zps::worker

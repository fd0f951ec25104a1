// Compiled, never run, by the thread_safety.* tests (clang builds only): proves that the build's
// warning flags check the lock-order annotations. ACQUIRED_BEFORE / ACQUIRED_AFTER are checked by
// clang only under -Wthread-safety-beta; without it the wrong order below compiles silently.
// With ZPS_PROBE_WRONG_ORDER each function takes its two locks against the declared order, as
// the shard's parts would if one took its lock before ShardState::mu_.
#include "zps/common/thread_annotations.h"

namespace {

// As a shard part (ChunkStore, BufferPool) whose lock comes after the owner's.
struct Part {
  zps::Mutex mu_;
  int value GUARDED_BY(mu_) = 0;
};

// As ShardState: its mutex before the part's (declared on the owner's side).
struct Owner {
  zps::Mutex mu_ ACQUIRED_BEFORE(Part::mu_);
  Part part;

  void Update() {
#ifdef ZPS_PROBE_WRONG_ORDER
    zps::MutexLock inner(&part.mu_);
    zps::MutexLock outer(&mu_);
#else
    zps::MutexLock outer(&mu_);
    zps::MutexLock inner(&part.mu_);
#endif
    ++part.value;
  }
};

// As ThreadPool: the order declared on the later lock's side.
struct Pool {
  zps::Mutex call_mu_;
  zps::Mutex mu_ ACQUIRED_AFTER(call_mu_);
  int calls GUARDED_BY(mu_) = 0;

  void Call() {
#ifdef ZPS_PROBE_WRONG_ORDER
    zps::MutexLock inner(&mu_);
    zps::MutexLock outer(&call_mu_);
#else
    zps::MutexLock outer(&call_mu_);
    zps::MutexLock inner(&mu_);
#endif
    ++calls;
  }
};

}  // namespace

int main() {
  Owner o;
  o.Update();
  Pool p;
  p.Call();
  return 0;
}

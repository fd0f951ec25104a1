// The shared state of a FetchOp: a count of pieces still expected, completed by the data plane
// (Client) or a FetchPromise. Private to the worker library.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "zps/common/status.h"
#include "zps/common/thread_annotations.h"
#include "zps/worker/fetch_op.h"

namespace zps::worker {

struct FetchOp::State {
  Mutex mu;
  CondVar cv;
  size_t remaining GUARDED_BY(mu) = 0;
  std::vector<uint32_t> waiting GUARDED_BY(mu);  // the shard of each piece not answered yet
  Status error GUARDED_BY(mu);
  int64_t version GUARDED_BY(mu) = INT64_MAX;  // the lowest version over pieces
  std::shared_ptr<ParamBuffer> buffer;

  void Complete(uint32_t shard, const Status& s, int64_t piece_version) {
    {
      MutexLock lock(&mu);
      auto w = std::find(waiting.begin(), waiting.end(), shard);
      if (w != waiting.end()) waiting.erase(w);
      if (!s.ok() && error.ok()) error = s;
      version = std::min(version, piece_version);
      --remaining;
    }
    cv.SignalAll();
  }
};

}  // namespace zps::worker

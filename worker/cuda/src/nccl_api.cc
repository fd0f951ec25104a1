#include "nccl_api.h"

#include <cstdlib>
#include <string>

#include "dl_open.h"
#include "zps/common/logging.h"

namespace zps::worker::nccl {

namespace {

struct Loaded {
  Api api;
  Status status;
};

Loaded Load() {
  Loaded out;
  std::string tried;
  void* handle =
      internal::OpenFirst({std::getenv("ZPS_NCCL"), "libnccl.so.2", "libnccl.so"}, tried);
  if (handle == nullptr) {
    out.status = FailedPrecondition("NCCL is not available: libnccl is not found (" + tried +
                                    "); set ZPS_NCCL to its path");
    return out;
  }
  internal::SymbolBinder bind(handle);
  Api& a = out.api;
  bind(a.GetVersion, "ncclGetVersion");
  bind(a.GetUniqueId, "ncclGetUniqueId");
  bind(a.CommInitRank, "ncclCommInitRank");
  bind(a.CommDestroy, "ncclCommDestroy");
  bind(a.CommAbort, "ncclCommAbort");
  bind(a.CommGetAsyncError, "ncclCommGetAsyncError");
  bind(a.GetErrorString, "ncclGetErrorString");
  bind(a.GetLastError, "ncclGetLastError");
  bind(a.ReduceScatter, "ncclReduceScatter");
  bind(a.AllGather, "ncclAllGather");
  bind(a.AllReduce, "ncclAllReduce");
  if (!bind.missing().empty()) {
    out.status = FailedPrecondition("NCCL is not available: the library lacks " + bind.missing());
    return out;
  }
  int version = 0;
  (void)a.GetVersion(&version);
  ZPS_LOG(DEBUG) << "nccl: version " << version << " loaded";
  return out;
}

}  // namespace

Result<const Api*> LoadNcclApi() {
  static const Loaded* loaded = new Loaded(Load());  // never freed, like the CUDA runtime
  if (!loaded->status.ok()) return loaded->status;
  return &loaded->api;
}

Status NcclStatus(const Api& api, ncclResult_t r, std::string_view what, ncclComm_t comm) {
  if (r == ncclSuccess) return Status::Ok();
  std::string msg = std::string(what) + ": " + api.GetErrorString(r);
  const char* last = comm != nullptr ? api.GetLastError(comm) : nullptr;
  if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return InvalidArgument(msg);
    case ncclSystemError:
    case ncclRemoteError:
      return Unavailable(msg);
    default:
      return Internal(msg);
  }
}

}  // namespace zps::worker::nccl

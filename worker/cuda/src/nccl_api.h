// nccl_api.h (worker/cuda internal) — NCCL, opened with dlopen, and the one conversion of
// ncclResult_t into a Status.
//
// The library is found at run time (ZPS_NCCL, else libnccl.so.2, libnccl.so): a process with
// torch already has torch's libnccl.so.2 loaded, and gets that one. Opened once per process.
//
// Thread-safety: LoadNcclApi may be called from any thread; the table is immutable.
#pragma once

#include <nccl.h>

#include <string_view>

#include "zps/common/status.h"

namespace zps::worker::nccl {

struct Api {
  decltype(&::ncclGetVersion) GetVersion = nullptr;
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRank) CommInitRank = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
  decltype(&::ncclGetLastError) GetLastError = nullptr;
  decltype(&::ncclReduceScatter) ReduceScatter = nullptr;
  decltype(&::ncclAllGather) AllGather = nullptr;
  decltype(&::ncclAllReduce) AllReduce = nullptr;
};

/// NCCL, loaded on first use. Errors: FailedPrecondition "NCCL is not available: ...".
Result<const Api*> LoadNcclApi();

/// THE conversion of an ncclResult_t: Ok for ncclSuccess; InvalidArgument for invalid
/// arguments or usage, Unavailable for system and remote errors (a peer or the network lost),
/// Internal otherwise; the message names `what`, NCCL's text and its last error for `comm`.
Status NcclStatus(const Api& api, ncclResult_t r, std::string_view what, ncclComm_t comm);

}  // namespace zps::worker::nccl

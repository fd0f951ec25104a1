// zps/common/ucx/handles.h — RAII owners for raw UCX (ucp) handles and the one conversion of
// ucs_status_t into zps::Status.
//
// Most code uses the higher-level zps/common/ucx.h (Context, Worker, MemoryRegion). These owners
// are public so that tests and adapters can hold a raw handle safely.
//
// Thread-safety: the owners are move-only values. Destroying a worker or endpoint handle must
// happen on the thread that owns the ucp_worker (the progress thread, see ucx.h).
#pragma once

#include <ucp/api/ucp.h>

#include <memory>
#include <string_view>

#include "zps/common/status.h"

namespace zps::ucx {

/// The one conversion of a UCX status into a zps Status. UCS_OK → OK; peer and connection
/// failures (UCS_ERR_CONNECTION_RESET, UCS_ERR_ENDPOINT_TIMEOUT, UCS_ERR_UNREACHABLE,
/// UCS_ERR_REJECTED, UCS_ERR_NOT_CONNECTED, UCS_ERR_TIMED_OUT, UCS_ERR_IO_ERROR) → Unavailable;
/// UCS_ERR_CANCELED → Cancelled; UCS_ERR_NO_MEMORY / UCS_ERR_EXCEEDS_LIMIT → ResourceExhausted;
/// UCS_ERR_INVALID_PARAM / UCS_ERR_MESSAGE_TRUNCATED → InvalidArgument; UCS_ERR_UNSUPPORTED →
/// Unimplemented; anything else → Internal. The message is "what: <ucs_status_string>".
Status FromUcs(ucs_status_t status, std::string_view what);

struct ConfigDeleter {
  void operator()(ucp_config_t* config) const { ucp_config_release(config); }
};
struct ContextDeleter {
  void operator()(ucp_context* context) const { ucp_cleanup(context); }
};
struct WorkerDeleter {
  void operator()(ucp_worker* worker) const { ucp_worker_destroy(worker); }
};
struct RkeyDeleter {
  void operator()(ucp_rkey* rkey) const { ucp_rkey_destroy(rkey); }
};
struct RkeyBufferDeleter {
  void operator()(void* buffer) const { ucp_rkey_buffer_release(buffer); }
};
struct WorkerAddressDeleter {
  ucp_worker_h worker = nullptr;
  void operator()(ucp_address_t* address) const { ucp_worker_release_address(worker, address); }
};
/// Unmaps a memory handle; needs the context it was mapped with.
struct MemDeleter {
  ucp_context_h context = nullptr;
  void operator()(ucp_mem* mem) const { (void)ucp_mem_unmap(context, mem); }
};

using ConfigPtr = std::unique_ptr<ucp_config_t, ConfigDeleter>;
using ContextPtr = std::unique_ptr<ucp_context, ContextDeleter>;
using WorkerPtr = std::unique_ptr<ucp_worker, WorkerDeleter>;
using RkeyPtr = std::unique_ptr<ucp_rkey, RkeyDeleter>;
using RkeyBufferPtr = std::unique_ptr<void, RkeyBufferDeleter>;
using WorkerAddressPtr = std::unique_ptr<ucp_address_t, WorkerAddressDeleter>;
using MemPtr = std::unique_ptr<ucp_mem, MemDeleter>;

}  // namespace zps::ucx

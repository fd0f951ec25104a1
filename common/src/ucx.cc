// UCX status conversion, Context and MemoryRegion. The Worker lives in ucx_worker.cc.
#include "zps/common/ucx.h"

#include <string>

#include "zps/common/logging.h"

namespace zps::ucx {

Status FromUcs(ucs_status_t status, std::string_view what) {
  if (status == UCS_OK) return Status::Ok();
  std::string msg = std::string(what) + ": " + ucs_status_string(status);
  switch (status) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_IO_ERROR:
      return Unavailable(std::move(msg));
    case UCS_ERR_CANCELED:
      return Cancelled(std::move(msg));
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
    case UCS_ERR_NO_RESOURCE:
      return ResourceExhausted(std::move(msg));
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_MESSAGE_TRUNCATED:
    case UCS_ERR_NO_ELEM:
    case UCS_ERR_INVALID_ADDR:
      return InvalidArgument(std::move(msg));
    case UCS_ERR_UNSUPPORTED:
      return Unimplemented(std::move(msg));
    default:
      return Internal(std::move(msg));
  }
}

namespace {

Status Modify(ucp_config_t* config, const std::string& name, const std::string& value) {
  ucs_status_t st = ucp_config_modify(config, name.c_str(), value.c_str());
  if (st != UCS_OK) {
    // UCX reports unknown names as NO_ELEM and bad values as INVALID_PARAM: both are caller input.
    return InvalidArgument("UCX setting " + name + "=" + value + ": " + ucs_status_string(st));
  }
  return Status::Ok();
}

}  // namespace

Context::~Context() {
  if (leak_.load()) (void)context_.release();  // see LeakOnDestruction
}

Result<std::unique_ptr<Context>> Context::Create(const ContextOptions& options) {
  ucp_config_t* raw_config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &raw_config);
  if (st != UCS_OK) return FromUcs(st, "ucp_config_read");
  ConfigPtr config(raw_config);

  std::unique_ptr<Context> ctx(new Context());
  ctx->transports_ = options.transports == "shm" ? "posix,cma,self" : options.transports;
  if (!ctx->transports_.empty()) {
    ZPS_RETURN_IF_ERROR(Modify(config.get(), "TLS", ctx->transports_));
    ctx->peer_failure_capable_ = false;
    std::string_view rest = ctx->transports_;
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      std::string_view tl = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      static constexpr std::string_view kShmOnly[] = {"posix", "sysv", "cma", "knem",
                                                      "xpmem", "self", "sm",  "shm"};
      bool shm = false;
      for (auto name : kShmOnly) shm = shm || tl == name;
      if (!shm) ctx->peer_failure_capable_ = true;  // tcp, rc, ud, dc, ib, all, ^exclusions...
    }
  }
  if (options.keepalive_interval.count() > 0) {
    ZPS_RETURN_IF_ERROR(Modify(config.get(), "KEEPALIVE_INTERVAL",
                               std::to_string(options.keepalive_interval.count()) + "ms"));
  }
  for (const auto& [name, value] : options.config) {
    ZPS_RETURN_IF_ERROR(Modify(config.get(), name, value));
  }

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.name = "zps";
  ucp_context_h raw_ctx = nullptr;
  st = ucp_init(&params, config.get(), &raw_ctx);
  if (st != UCS_OK) {
    Status s = FromUcs(st, "ucp_init(TLS=" + ctx->transports_ + ")");
    ZPS_LOG(ERROR) << s.ToString();
    return s;
  }
  ctx->context_.reset(raw_ctx);
  return ctx;
}

Result<std::unique_ptr<MemoryRegion>> Context::Register(std::span<std::byte> memory) {
  if (memory.empty()) return InvalidArgument("ucx: cannot register an empty span");
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = memory.data();
  params.length = memory.size();
  ucp_mem_h mem = nullptr;
  ucs_status_t st = ucp_mem_map(context_.get(), &params, &mem);
  if (st != UCS_OK) return FromUcs(st, "ucp_mem_map");

  std::unique_ptr<MemoryRegion> region(new MemoryRegion());
  region->memory_ = memory;
  region->mem_ = MemPtr(mem, MemDeleter{context_.get()});
  ZPS_RETURN_IF_ERROR(region->PackRkey(context_.get()));
  return region;
}

Result<std::unique_ptr<MemoryRegion>> Context::Allocate(size_t size) {
  if (size == 0) return InvalidArgument("ucx: cannot allocate 0 bytes");
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.address = nullptr;
  params.length = size;
  params.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h mem = nullptr;
  ucs_status_t st = ucp_mem_map(context_.get(), &params, &mem);
  if (st != UCS_OK) return FromUcs(st, "ucp_mem_map(ALLOCATE)");
  std::unique_ptr<MemoryRegion> region(new MemoryRegion());
  region->mem_ = MemPtr(mem, MemDeleter{context_.get()});
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  st = ucp_mem_query(mem, &attr);
  if (st != UCS_OK) return FromUcs(st, "ucp_mem_query");
  region->memory_ = {static_cast<std::byte*>(attr.address), size};
  ZPS_RETURN_IF_ERROR(region->PackRkey(context_.get()));
  return region;
}

Status MemoryRegion::PackRkey(ucp_context_h context) {
  void* rkey_raw = nullptr;
  size_t rkey_size = 0;
  ucs_status_t st = ucp_rkey_pack(context, mem_.get(), &rkey_raw, &rkey_size);
  if (st != UCS_OK) return FromUcs(st, "ucp_rkey_pack");
  RkeyBufferPtr rkey_buf(rkey_raw);
  const auto* bytes = static_cast<const std::byte*>(rkey_raw);
  rkey_.assign(bytes, bytes + rkey_size);
  return Status::Ok();
}

bool MemoryRegion::Contains(const void* p, size_t n) const {
  auto begin = reinterpret_cast<uintptr_t>(memory_.data());
  auto q = reinterpret_cast<uintptr_t>(p);
  return q >= begin && n <= memory_.size() && q - begin <= memory_.size() - n;
}

}  // namespace zps::ucx

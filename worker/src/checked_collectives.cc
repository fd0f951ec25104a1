#include "zps/worker/checked_collectives.h"

#include <cstring>
#include <string_view>
#include <vector>

#include "zps/common/logging.h"

namespace zps::worker {

namespace {

// The descriptor each rank contributes: fixed size, so that the exchange matches whatever the
// ranks are about to do.
struct Wire {
  uint64_t magic;
  uint64_t seq;
  uint32_t kind;
  uint32_t id;
  uint64_t count;
};
static_assert(sizeof(Wire) == 32);
constexpr uint64_t kMagic = 0x7a70732d636f6c6cull;  // "zps-coll"
// Ends every mismatch's message; IsCollectiveMismatch looks for it.
constexpr std::string_view kMismatch = "the ranks issued different collectives";

const char* KindName(CollectiveOp::Kind k) {
  return k == CollectiveOp::Kind::kReduceScatter ? "reduce-scatter" : "all-gather";
}

const char* Unit(CollectiveOp::Kind k) {
  return k == CollectiveOp::Kind::kReduceScatter ? " elements" : " bytes per rank";
}

}  // namespace

bool IsCollectiveMismatch(const Status& s) {
  return s.code() == Code::kFailedPrecondition && s.message().find(kMismatch) != std::string::npos;
}

CheckedCollectives::CheckedCollectives(Collectives* inner, Namer namer)
    : inner_(inner), namer_(std::move(namer)) {}

std::string CheckedCollectives::Name(const CollectiveOp& op) const {
  std::string name = namer_ ? namer_(op) : "operation " + std::to_string(op.id);
  return std::string(KindName(op.kind)) + " of " + name + ", " + std::to_string(op.count) +
         Unit(op.kind);
}

Status CheckedCollectives::Describe(const CollectiveOp& op, Status s) const {
  return Status(s.code(), "collective #" + std::to_string(seq_) + " (" + Name(op) + ") on rank " +
                              std::to_string(rank()) + " of " + std::to_string(world_size()) +
                              ": " + s.message());
}

Status CheckedCollectives::Agree(const CollectiveOp& op) {
  const uint32_t world = world_size();
  std::vector<Wire> all(world);
  Wire& mine = all[rank()];
  mine = {kMagic, seq_, static_cast<uint32_t>(op.kind), op.id, op.count};
  Status s = inner_->AllGather(std::as_writable_bytes(std::span<Wire>(all)), sizeof(Wire));
  if (!s.ok()) return Describe(op, s);
  for (uint32_t q = 0; q < world; ++q) {
    const Wire& w = all[q];
    if (w.magic == kMagic && w.seq == mine.seq && w.kind == mine.kind && w.id == mine.id &&
        w.count == mine.count) {
      continue;
    }
    std::string theirs;
    if (w.magic != kMagic || (w.kind != 1 && w.kind != 2)) {
      theirs = "an unreadable descriptor";
    } else {
      CollectiveOp other{static_cast<CollectiveOp::Kind>(w.kind), w.id, w.count};
      theirs = "collective #" + std::to_string(w.seq) + " (" + Name(other) + ")";
    }
    return Describe(op, FailedPrecondition("rank " + std::to_string(q) + " issued " + theirs +
                                           " instead: " + std::string(kMismatch)));
  }
  return Status::Ok();
}

Status CheckedCollectives::Run(const CollectiveOp& op, const std::function<Status()>& call) {
  Status s = world_size() == 1 ? Status::Ok() : Agree(op);
  if (s.ok()) {
    s = call();
    if (!s.ok()) s = Describe(op, s);
  }
  ++seq_;
  if (!s.ok()) {
    ZPS_LOG(ERROR) << s.ToString();
    broken_ = s;
  }
  return s;
}

Status CheckedCollectives::ReduceScatter(uint32_t id, std::span<float> inout) {
  if (!broken_.ok()) return broken_;
  return Run({CollectiveOp::Kind::kReduceScatter, id, inout.size()},
             [&] { return inner_->ReduceScatter(inout); });
}

Status CheckedCollectives::AllGather(uint32_t id, std::span<std::byte> inout, size_t block_bytes) {
  if (!broken_.ok()) return broken_;
  if (inout.size() != block_bytes * world_size()) {
    return InvalidArgument("all-gather: " + std::to_string(inout.size()) + " bytes, expected " +
                           std::to_string(world_size()) + " blocks of " +
                           std::to_string(block_bytes));
  }
  return Run({CollectiveOp::Kind::kAllGather, id, block_bytes},
             [&] { return inner_->AllGather(inout, block_bytes); });
}

}  // namespace zps::worker

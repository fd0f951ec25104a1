// docs/protocol.md carries one field table per message between
//   <!-- wire-table: Name -->  and  <!-- end wire-table -->
// and each must be what wire::FieldTable renders from the declaration in messages.h: a field
// added to, removed from or changed in a message fails here until the doc says the same. To
// rewrite the tables from the declarations, run with ZPS_UPDATE_PROTOCOL_DOC=1.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "zps/common/messages.h"

#ifndef ZPS_SOURCE_DIR
#error "ZPS_SOURCE_DIR must name the source tree"
#endif

namespace zps::msg {
namespace {

constexpr std::string_view kBegin = "<!-- wire-table: ";
constexpr std::string_view kEnd = "<!-- end wire-table -->";

template <typename... M>
std::map<std::string, std::string> Render() {
  std::map<std::string, std::string> out;
  ((out[std::string(M::kWireName)] = wire::FieldTable<M>()), ...);
  return out;
}

// Every wire struct of messages.h.
std::map<std::string, std::string> Tables() {
  return Render<ChunkCrcsRequest, ReadMasterRequest, MasterRange, ChunkCrcs, RegisterShard, Join,
                JoinReply, ChunkStat, Report, CommitInfo, AwaitCommit, FetchHeader,
                FetchReplyHeader, FetchRmaReplyHeader, PushHeader, PushRmaHeader,
                ServingNoticeHeader, PushReplyHeader, CheckpointReport, ResumeState, ShardSync,
                ShardSyncReply, CheckpointDone, KvSet, KvGet, KvReply, ReshardInfo, ReshardFetch,
                ReshardValues, ReshardReport, ReshardStatus>();
}

std::string DocPath() { return std::string(ZPS_SOURCE_DIR) + "/docs/protocol.md"; }

std::string ReadDoc() {
  std::ifstream in(DocPath());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Block {
  std::string name;
  size_t body_begin = 0;  // just after the begin marker's line
  size_t body_end = 0;    // at the end marker
};

std::vector<Block> Blocks(const std::string& doc) {
  std::vector<Block> out;
  for (size_t at = doc.find(kBegin); at != std::string::npos; at = doc.find(kBegin, at + 1)) {
    Block b;
    const size_t name_at = at + kBegin.size();
    b.name = doc.substr(name_at, doc.find(' ', name_at) - name_at);
    b.body_begin = doc.find('\n', at) + 1;
    b.body_end = doc.find(kEnd, b.body_begin);
    out.push_back(b);
  }
  return out;
}

TEST(ProtocolDoc, FieldTablesMatchTheDeclarations) {
  const auto tables = Tables();
  std::string doc = ReadDoc();
  ASSERT_FALSE(doc.empty()) << "cannot read " << DocPath();
  const auto blocks = Blocks(doc);
  const bool update = std::getenv("ZPS_UPDATE_PROTOCOL_DOC") != nullptr;

  std::map<std::string, int> seen;
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {  // back to front: offsets hold
    const Block& b = *it;
    ++seen[b.name];
    ASSERT_NE(b.body_end, std::string::npos) << b.name << ": no end marker";
    auto want = tables.find(b.name);
    if (want == tables.end()) {
      ADD_FAILURE() << "docs/protocol.md has a table for " << b.name
                    << ", which messages.h does not declare";
      continue;
    }
    const std::string have = doc.substr(b.body_begin, b.body_end - b.body_begin);
    if (update) {
      doc.replace(b.body_begin, b.body_end - b.body_begin, want->second);
    } else {
      EXPECT_EQ(have, want->second)
          << "docs/protocol.md's table of " << b.name
          << " differs from its declaration in messages.h; the declaration renders as\n"
          << want->second << "(ZPS_UPDATE_PROTOCOL_DOC=1 rewrites the doc's tables)";
    }
  }
  for (const auto& [name, table] : tables) {
    EXPECT_EQ(seen[name], 1) << "docs/protocol.md should have exactly one table of " << name
                             << ":\n"
                             << kBegin << name << " -->\n"
                             << table << kEnd;
  }
  if (update) std::ofstream(DocPath()) << doc;
}

}  // namespace
}  // namespace zps::msg

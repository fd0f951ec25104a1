// The docs' job-spec tables are generated from the field lists of zps/common/job_spec.h: this test
// fails when a table between its BEGIN/END markers differs from what JobSpecDocTable renders.
// To update the docs after changing a field list: ZPS_UPDATE_DOCS=1 build/bin/test_common_job_spec
// --gtest_filter='JobSpecDoc.*' (it rewrites the tables in place), then review the diff.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "zps/common/job_spec.h"

namespace zps {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Compares the text between the markers of table `which` in `doc` with the rendered table.
void CheckTable(const std::string& doc, const std::string& which) {
  const std::string path = std::string(ZPS_SOURCE_DIR) + "/" + doc;
  std::string text = Read(path);
  ASSERT_FALSE(text.empty()) << path;
  const std::string begin = "<!-- BEGIN GENERATED job-spec " + which + " -->\n";
  const std::string end = "<!-- END GENERATED job-spec " + which + " -->";
  const size_t b = text.find(begin);
  ASSERT_NE(b, std::string::npos) << path << " has no line " << begin;
  const size_t from = b + begin.size();
  const size_t e = text.find(end, from);
  ASSERT_NE(e, std::string::npos) << path << " has no line " << end;
  const std::string want = JobSpecDocTable(which);
  ASSERT_FALSE(want.empty());
  if (text.substr(from, e - from) == want) return;
  const char* update = std::getenv("ZPS_UPDATE_DOCS");
  if (update != nullptr && std::string(update) == "1") {
    text.replace(from, e - from, want);
    std::ofstream(path) << text;
    GTEST_SKIP() << "rewrote the table in " << path;
  }
  ADD_FAILURE() << path << ": the job-spec " << which
                << " table differs from the field lists in common/include/zps/common/job_spec.h"
                   " (ZPS_UPDATE_DOCS=1 rewrites it). It should read:\n"
                << want;
}

TEST(JobSpecDoc, JsonKeyTableMatchesTheFieldLists) { CheckTable("docs/pytorch.md", "json"); }

TEST(JobSpecDoc, BinaryTableMatchesTheFieldLists) { CheckTable("docs/protocol.md", "binary"); }

}  // namespace
}  // namespace zps

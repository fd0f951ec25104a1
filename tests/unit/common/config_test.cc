#include "zps/common/config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace zps {
namespace {

struct Opts {
  std::string name = "shard";  // Default: "shard"
  int64_t port = 7000;         // Default: 7000
  uint64_t budget = 1024;      // Default: 1024
  bool verbose = false;        // Default: false
  double lr = 0.001;           // Default: 0.001
};

void Register(Flags& f, Opts& o) {
  f.Add("name", "name", &o.name);
  f.Add("port", "port", &o.port, 1, 65535);
  f.AddBytes("memory-budget", "budget", &o.budget);
  f.Add("verbose", "verbose", &o.verbose);
  f.Add("lr", "learning rate", &o.lr);
}

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("ZPS_PORT");
    unsetenv("ZPS_CONFIG");
    unsetenv("ZPS_MEMORY_BUDGET");
    dir_ = std::filesystem::temp_directory_path() / ("zps_config_test_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    unsetenv("ZPS_PORT");
    std::filesystem::remove_all(dir_);
  }
  std::string Write(const std::string& text) {
    auto p = dir_ / "c.json";
    std::ofstream(p) << text;
    return p.string();
  }
  std::filesystem::path dir_;
};

TEST_F(ConfigTest, ParseBytes) {
  EXPECT_EQ(*ParseBytes("4096"), 4096u);
  EXPECT_EQ(*ParseBytes("2GiB"), 2ull << 30);
  EXPECT_EQ(*ParseBytes("64M"), 64ull << 20);
  EXPECT_EQ(*ParseBytes("1.5G"), 3ull << 29);
  EXPECT_EQ(*ParseBytes("512MB"), 512000000ull);
  EXPECT_FALSE(ParseBytes("lots").ok());
  EXPECT_FALSE(ParseBytes("3 parsecs").ok());
}

TEST_F(ConfigTest, DefaultsStayWithoutSources) {
  Opts o;
  Flags f("t", "test");
  Register(f, o);
  const char* argv[] = {"t"};
  ASSERT_EQ(*f.Parse(1, argv), ParseOutcome::kRun);
  EXPECT_EQ(o.port, 7000);
  EXPECT_EQ(o.name, "shard");
}

TEST_F(ConfigTest, FileThenEnvThenFlags) {
  Opts o;
  Flags f("t", "test");
  Register(f, o);
  std::string path =
      Write(R"({"port": 7100, "name": "from-file", "memory-budget": "2GiB", "verbose": true})");
  setenv("ZPS_PORT", "7200", 1);
  std::string cfg = "--config=" + path;
  const char* argv[] = {"t", cfg.c_str(), "--name", "from-flag", "--lr=0.5"};
  ASSERT_EQ(*f.Parse(5, argv), ParseOutcome::kRun);
  EXPECT_EQ(o.port, 7200);          // env beats file
  EXPECT_EQ(o.name, "from-flag");   // flag beats file
  EXPECT_EQ(o.budget, 2ull << 30);  // file
  EXPECT_TRUE(o.verbose);
  EXPECT_DOUBLE_EQ(o.lr, 0.5);
}

TEST_F(ConfigTest, BadValuesAreErrors) {
  {
    Opts o;
    Flags f("t", "test");
    Register(f, o);
    const char* argv[] = {"t", "--port=99999"};
    auto r = f.Parse(2, argv);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("--port"), std::string::npos);
  }
  {
    Opts o;
    Flags f("t", "test");
    Register(f, o);
    setenv("ZPS_PORT", "seven", 1);
    const char* argv[] = {"t"};
    auto r = f.Parse(1, argv);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("ZPS_PORT"), std::string::npos);
  }
  {
    Opts o;
    Flags f("t", "test");
    Register(f, o);
    std::string path = Write(R"({"prot": 7100})");
    std::string cfg = "--config=" + path;
    const char* argv[] = {"t", cfg.c_str()};
    auto r = f.Parse(2, argv);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("prot"), std::string::npos);
  }
  {
    Opts o;
    Flags f("t", "test");
    Register(f, o);
    const char* argv[] = {"t", "--nope=1"};
    EXPECT_FALSE(f.Parse(2, argv).ok());
  }
  {
    Opts o;
    Flags f("t", "test");
    Register(f, o);
    std::string path = Write("{not json");
    std::string cfg = "--config=" + path;
    const char* argv[] = {"t", cfg.c_str()};
    EXPECT_EQ(f.Parse(2, argv).status().code(), Code::kInvalidArgument);
  }
}

TEST_F(ConfigTest, HelpAndPositional) {
  Opts o;
  Flags f("zps-bench", "benchmarks");
  Register(f, o);
  f.AllowPositional(1, "optimizer|transport");
  const char* argv[] = {"zps-bench", "optimizer", "--verbose"};
  ASSERT_EQ(*f.Parse(3, argv), ParseOutcome::kRun);
  ASSERT_EQ(f.positional().size(), 1u);
  EXPECT_EQ(f.positional()[0], "optimizer");
  EXPECT_TRUE(o.verbose);
  EXPECT_NE(f.Help().find("ZPS_MEMORY_BUDGET"), std::string::npos);
  const char* argv2[] = {"zps-bench", "a", "b"};
  EXPECT_FALSE(f.Parse(3, argv2).ok());
}

}  // namespace
}  // namespace zps

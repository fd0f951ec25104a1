// KvStore (the coordinator's rendezvous store), apart from the wire: values, long-poll waits,
// timeouts, generations and bounds.
#include "zps/server/kv_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "zps/common/messages.h"
#include "zps/testing/status_matchers.h"

namespace zps::server {
namespace {

using namespace std::chrono_literals;

std::vector<std::byte> Bytes(std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

// Collects one callback's result.
struct Box {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Result<std::vector<std::byte>>> r;
  KvStore::GetCallback cb() {
    return [this](const Result<std::vector<std::byte>>& v) {
      std::lock_guard<std::mutex> lock(mu);
      r = v;
      cv.notify_all();
    };
  }
  Result<std::vector<std::byte>> Wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, 10s, [&] { return r.has_value(); });
    if (!r) return Internal("no callback");
    return *r;
  }
  bool done() {
    std::lock_guard<std::mutex> lock(mu);
    return r.has_value();
  }
};

TEST(KvStore, SetThenGet) {
  KvStore kv;
  const uint64_t g = kv.generation();
  ASSERT_THAT(kv.Set(g, "a", Bytes("one")), IsOk());
  Box b;
  kv.Get(g, "a", 0ms, b.cb());
  auto v = b.Wait();
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(*v, Bytes("one"));
  // Replacing a value is allowed.
  ASSERT_THAT(kv.Set(g, "a", Bytes("two")), IsOk());
  Box c;
  kv.Get(g, "a", 0ms, c.cb());
  EXPECT_EQ(*c.Wait(), Bytes("two"));
  EXPECT_EQ(kv.size(), 1u);
}

TEST(KvStore, MissingWithoutWaitIsNotFound) {
  KvStore kv;
  Box b;
  kv.Get(kv.generation(), "nope", 0ms, b.cb());
  EXPECT_EQ(b.Wait().status().code(), Code::kNotFound);
}

TEST(KvStore, WaitingGetIsAnsweredBySet) {
  KvStore kv;
  const uint64_t g = kv.generation();
  Box b;
  kv.Get(g, "k", 5000ms, b.cb());
  EXPECT_FALSE(b.done());
  EXPECT_EQ(kv.waiters(), 1u);
  ASSERT_THAT(kv.Set(g, "k", Bytes("v")), IsOk());
  auto v = b.Wait();
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(*v, Bytes("v"));
  EXPECT_EQ(kv.waiters(), 0u);
}

TEST(KvStore, WaitExpires) {
  KvStore kv;
  Box b;
  const auto t0 = std::chrono::steady_clock::now();
  kv.Get(kv.generation(), "k", 50ms, b.cb());
  EXPECT_EQ(b.Wait().status().code(), Code::kDeadlineExceeded);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 50ms);
  EXPECT_EQ(kv.waiters(), 0u);
}

TEST(KvStore, NewGenerationDropsKeysAndFailsWaiters) {
  KvStore kv;
  const uint64_t g = kv.generation();
  ASSERT_THAT(kv.Set(g, "a", Bytes("x")), IsOk());
  Box b;
  kv.Get(g, "b", 5000ms, b.cb());
  kv.Advance(g + 1);
  EXPECT_EQ(b.Wait().status().code(), Code::kUnavailable);
  EXPECT_EQ(kv.size(), 0u);
  // The old generation is refused; the new one starts empty.
  EXPECT_EQ(kv.Set(g, "a", Bytes("y")).code(), Code::kUnavailable);
  Box c;
  kv.Get(g + 1, "a", 0ms, c.cb());
  EXPECT_EQ(c.Wait().status().code(), Code::kNotFound);
  kv.Advance(g);  // older: nothing changes
  EXPECT_EQ(kv.generation(), g + 1);
}

TEST(KvStore, Bounds) {
  KvStore kv({.max_keys = 2, .max_bytes = 10, .max_waiters = 1});
  const uint64_t g = kv.generation();
  EXPECT_EQ(kv.Set(g, "", Bytes("x")).code(), Code::kInvalidArgument);
  EXPECT_EQ(kv.Set(g, std::string(msg::kMaxKvKeyBytes + 1, 'k'), Bytes("x")).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(kv.Set(g, "big", std::vector<std::byte>(msg::kMaxKvValueBytes + 1)).code(),
            Code::kInvalidArgument);
  ASSERT_THAT(kv.Set(g, "a", Bytes("12345")), IsOk());
  EXPECT_EQ(kv.Set(g, "b", Bytes("123456")).code(), Code::kResourceExhausted);  // 11 bytes
  ASSERT_THAT(kv.Set(g, "b", Bytes("12345")), IsOk());
  EXPECT_EQ(kv.Set(g, "c", Bytes("")).code(), Code::kResourceExhausted);  // a third key
  ASSERT_THAT(kv.Set(g, "a", Bytes("1")), IsOk());  // replacing is within the bounds
  Box w1, w2, w3;
  kv.Get(g, "x", 5000ms, w1.cb());
  kv.Get(g, "y", 5000ms, w2.cb());
  EXPECT_EQ(w2.Wait().status().code(), Code::kResourceExhausted);
  kv.Get(g, "x", std::chrono::milliseconds(msg::kMaxKvWaitMs + 1), w3.cb());
  EXPECT_EQ(w3.Wait().status().code(), Code::kInvalidArgument);
  kv.Advance(g + 1);
  EXPECT_EQ(w1.Wait().status().code(), Code::kUnavailable);
}

TEST(KvStore, DestructionCancelsWaiters) {
  Box b;
  {
    KvStore kv;
    kv.Get(kv.generation(), "k", 5000ms, b.cb());
  }
  EXPECT_EQ(b.Wait().status().code(), Code::kCancelled);
}

TEST(KvMessages, RoundTripAndBounds) {
  msg::KvSet set{7, "gloo/0", Bytes("addr")};
  auto s2 = msg::KvSet::Decode(set.Encode());
  ASSERT_THAT(s2, IsOk());
  EXPECT_EQ(s2->generation, 7u);
  EXPECT_EQ(s2->key, "gloo/0");
  EXPECT_EQ(s2->value, Bytes("addr"));
  msg::KvGet get{0, "gloo/1", 1500};
  auto g2 = msg::KvGet::Decode(get.Encode());
  ASSERT_THAT(g2, IsOk());
  EXPECT_EQ(g2->wait_ms, 1500u);
  msg::KvReply reply{3, Bytes("v")};
  auto r2 = msg::KvReply::Decode(reply.Encode());
  ASSERT_THAT(r2, IsOk());
  EXPECT_EQ(r2->generation, 3u);
  EXPECT_EQ(r2->value, Bytes("v"));

  EXPECT_EQ(msg::KvSet::Decode(msg::KvSet{0, "", {}}.Encode()).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(
      msg::KvSet::Decode(msg::KvSet{0, std::string(msg::kMaxKvKeyBytes + 1, 'k'), {}}.Encode())
          .status()
          .code(),
      Code::kInvalidArgument);
  EXPECT_EQ(msg::KvSet::Decode(
                msg::KvSet{0, "k", std::vector<std::byte>(msg::kMaxKvValueBytes + 1)}.Encode())
                .status()
                .code(),
            Code::kInvalidArgument);
  EXPECT_EQ(msg::KvGet::Decode(msg::KvGet{0, "k", msg::kMaxKvWaitMs + 1}.Encode()).status().code(),
            Code::kInvalidArgument);
  auto trailing = get.Encode();
  trailing.push_back(std::byte{0});
  EXPECT_EQ(msg::KvGet::Decode(trailing).status().code(), Code::kInvalidArgument);
  auto shortened = set.Encode();
  shortened.pop_back();
  EXPECT_EQ(msg::KvSet::Decode(shortened).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace zps::server

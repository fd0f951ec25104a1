// zps/testing/status_matchers.h — gmock matchers for zps::Status and zps::Result<T>.
//
//   ASSERT_THAT(shard->BeginPush(req), IsOk());
//   EXPECT_THAT(store.Load(id), StatusIs(Code::kDataLoss));
//   EXPECT_THAT(s, StatusIs(Code::kInvalidArgument, HasSubstr("world_size")));
//
// On failure the matcher prints the Status ("CODE: message"), which `ASSERT_TRUE(x.ok())`
// never did. Both work on a Status and on a Result<T> of any T (also move-only ones); a Result
// is printed by its status, never by its value's bytes.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <type_traits>

#include "zps/common/status.h"

namespace zps {

// gtest's value printers, found by ADL: a Status as "CODE: message", a Result by its status.
inline void PrintTo(const Status& s, std::ostream* os) { *os << s.ToString(); }
template <typename T>
void PrintTo(const Result<T>& r, std::ostream* os) {
  *os << (r.ok() ? std::string("OK (a value)") : r.status().ToString());
}

/// The Status of a Status or a Result<T> (the matchers' helper).
inline Status StatusOfForMatcher(const Status& s) { return s; }
template <typename T>
Status StatusOfForMatcher(const Result<T>& r) {
  return r.status();
}

/// Matches an OK Status, or a Result that holds a value.
MATCHER(IsOk, "is OK") {
  const Status s = ::zps::StatusOfForMatcher(arg);
  if (!s.ok()) *result_listener << "whose status is " << s.ToString();
  return s.ok();
}

/// Matches a Status or Result whose code is `code` (and, with a second argument, whose message
/// matches that string matcher, e.g. HasSubstr("...")).
MATCHER_P(StatusIs, code, "has code " + std::string(::zps::CodeName(code))) {
  const Status s = ::zps::StatusOfForMatcher(arg);
  *result_listener << "whose status is " << s.ToString();
  return s.code() == code;
}
MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + std::string(::zps::CodeName(code)) + " and a message that " +
               ::testing::DescribeMatcher<std::string>(message_matcher)) {
  const Status s = ::zps::StatusOfForMatcher(arg);
  *result_listener << "whose status is " << s.ToString();
  return s.code() == code && ::testing::Matches(::testing::SafeMatcherCast<const std::string&>(
                                 message_matcher))(s.message());
}

}  // namespace zps

#include "zps/common/status.h"

#include <gtest/gtest.h>

#include "zps/testing/status_matchers.h"

namespace zps {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  ZPS_ASSIGN_OR_RETURN(int h, Half(x));
  ZPS_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status Check(int x) {
  ZPS_RETURN_IF_ERROR(Quarter(x).status());
  return Status::Ok();
}

TEST(Status, OkAndErrors) {
  EXPECT_THAT(Status::Ok(), IsOk());
  Status s = NotFound("chunk 7");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_EQ(s.ToString(), "NOT_FOUND: chunk 7");
  EXPECT_EQ(s.WithContext("fetch").message(), "fetch: chunk 7");
}

TEST(Status, ResultPropagation) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), Code::kInvalidArgument);
  EXPECT_THAT(Check(12), IsOk());
  EXPECT_EQ(Check(2).code(), Code::kInvalidArgument);
}

TEST(Status, ErrnoError) {
  Status s = ErrnoError("open /x", ENOENT);
  EXPECT_EQ(s.code(), Code::kIoError);
  EXPECT_NE(s.message().find("No such file"), std::string::npos);
}

}  // namespace
}  // namespace zps

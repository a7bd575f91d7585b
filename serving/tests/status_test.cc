#include "status.h"

#include <gtest/gtest.h>

namespace serving {
namespace {

Status FailsWhen(bool fail) {
  if (fail) return InvalidArgument("bad");
  return Status::Ok();
}

Status Chain(bool fail, int* reached) {
  RETURN_IF_ERROR(FailsWhen(fail));
  *reached = 1;
  return Status::Ok();
}

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("odd");
  return x / 2;
}

Status Quarter(int x, int* out) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(*out, Half(half));
  return Status::Ok();
}

TEST(StatusTest, OkAndErrors) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s = NotFound("no model");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NOT_FOUND: no model");
}

TEST(StatusTest, HttpMapping) {
  EXPECT_EQ(HttpStatusFor(StatusCode::kOk), 200);
  EXPECT_EQ(HttpStatusFor(StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusFor(StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusFor(StatusCode::kPayloadTooLarge), 413);
  EXPECT_EQ(HttpStatusFor(StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusFor(StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatusFor(StatusCode::kInternal), 500);
}

TEST(StatusTest, ReturnIfError) {
  int reached = 0;
  EXPECT_FALSE(Chain(true, &reached).ok());
  EXPECT_EQ(reached, 0);
  EXPECT_TRUE(Chain(false, &reached).ok());
  EXPECT_EQ(reached, 1);
}

TEST(StatusTest, StatusOrAndAssignOrReturn) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Quarter(6, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  StatusOr<int> from_ok_status = Status::Ok();
  EXPECT_FALSE(from_ok_status.ok());
}

}  // namespace
}  // namespace serving

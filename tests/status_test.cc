// Status and StatusOr: codes, messages, and the early-return macros.
#include "tierkv/status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "tests/status_matchers.h"

namespace tierkv {
namespace {

StatusOr<int> ParsePositive(int v) {
  if (v <= 0)
    return Status::InvalidArgument("want > 0, got " + std::to_string(v));
  return v;
}

StatusOr<int> Doubled(int v) {
  TIERKV_ASSIGN_OR_RETURN(int x, ParsePositive(v));
  return 2 * x;
}

Status CheckBoth(int a, int b) {
  TIERKV_RETURN_IF_ERROR(ParsePositive(a).status());
  TIERKV_RETURN_IF_ERROR(ParsePositive(b).status());
  return Status::Ok();
}

TEST(Status, OkAndErrors) {
  EXPECT_THAT(Status::Ok(), IsOk());
  EXPECT_EQ(Status::Ok().ToString(), "OK");
  Status s = Status::ResourceExhausted("3 blocks free, need 5");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.ToString(), "ResourceExhausted: 3 blocks free, need 5");
}

TEST(StatusOr, ValueOrError) {
  StatusOr<int> good = Doubled(4);
  ASSERT_THAT(good, IsOk());
  EXPECT_EQ(*good, 8);
  StatusOr<int> bad = Doubled(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "want > 0, got -1");
}

TEST(StatusOr, OkStatusIsNotAValue) {
  StatusOr<int> wrong = Status::Ok();
  EXPECT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInternal);
}

TEST(StatusOr, MoveOnlyValues) {
  StatusOr<std::unique_ptr<int>> p = std::make_unique<int>(5);
  ASSERT_THAT(p, IsOk());
  std::unique_ptr<int> owned = std::move(p).value();
  EXPECT_EQ(*owned, 5);
}

TEST(Status, ReturnIfErrorStopsAtFirstError) {
  EXPECT_THAT(CheckBoth(1, 2), IsOk());
  EXPECT_EQ(CheckBoth(1, -2).message(), "want > 0, got -2");
  EXPECT_EQ(CheckBoth(-1, -2).message(), "want > 0, got -1");
}

TEST(StatusOrDeathTest, ValueOfErrorAborts) {
  StatusOr<int> bad = Status::NotFound("no such block");
  EXPECT_DEATH((void)bad.value(), "no such block");
}

// The matchers print the status a check did not expect.
TEST(StatusMatchersTest, FailuresNameTheStatus) {
  ::testing::StringMatchResultListener why;
  EXPECT_FALSE(::testing::ExplainMatchResult(
      IsOk(), Status::NotFound("no block 7"), &why));
  EXPECT_EQ(why.str(), "which is NotFound: no block 7");
  EXPECT_THAT(Status::Ok(), IsOk());
  EXPECT_THAT(StatusOr<int>(3), IsOkAndHolds(3));
  EXPECT_THAT(StatusOr<int>(3), ::testing::Not(IsOkAndHolds(4)));
  ::testing::StringMatchResultListener held;
  EXPECT_FALSE(::testing::ExplainMatchResult(
      IsOkAndHolds(3), StatusOr<int>(Status::Unavailable("gone")), &held));
  EXPECT_EQ(held.str(), "which is Unavailable: gone");
  EXPECT_THAT(StatusOr<int>(Status::DataLoss("torn")),
              StatusIs(StatusCode::kDataLoss));
  EXPECT_THAT(Status::Ok(), ::testing::Not(StatusIs(StatusCode::kDataLoss)));
}

}  // namespace
}  // namespace tierkv

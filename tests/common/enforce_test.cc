// Enforce macros print both operands and the caller's message.
#include <gtest/gtest.h>

#include "common/enforce.h"

namespace lockstep {
namespace {

TEST(Enforce, ComparisonFailurePrintsBothOperands) {
  const int got = 12, want = 16;
  try {
    LOCKSTEP_ENFORCE_EQ(got, want, "bucket {} size", 3);
    FAIL() << "no throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("bucket 3 size"), std::string::npos) << what;
    EXPECT_NE(what.find("got == want"), std::string::npos) << what;
    EXPECT_NE(what.find("12 vs 16"), std::string::npos) << what;
    EXPECT_NE(what.find("enforce_test.cc"), std::string::npos) << what;
  }
}

TEST(Enforce, PassingChecksDoNothing) {
  EXPECT_NO_THROW(LOCKSTEP_ENFORCE(1 + 1 == 2));
  EXPECT_NO_THROW(LOCKSTEP_ENFORCE_LT(1, 2, "ordered"));
}

TEST(Enforce, ArgumentChecksThrowInvalidArgument) {
  EXPECT_THROW(LOCKSTEP_CHECK_ARG(false, "bad {}", "input"), InvalidArgument);
  EXPECT_THROW(LOCKSTEP_CHECK_ARG_EQ(1, 2), InvalidArgument);
}

}  // namespace
}  // namespace lockstep

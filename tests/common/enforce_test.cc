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
    // The source line, relative to the repository: not the build
    // machine's path.
    EXPECT_EQ(what.rfind("tests/common/enforce_test.cc:", 0), 0u) << what;
  }
}

TEST(Enforce, PassingChecksDoNothing) {
  EXPECT_NO_THROW(LOCKSTEP_ENFORCE(1 + 1 == 2));
  EXPECT_NO_THROW(LOCKSTEP_ENFORCE_LT(1, 2, "ordered"));
}

// A caller's mistake is told in the caller's terms: the message alone, with
// no source line or C++ condition of lockstep's.
TEST(Enforce, ArgumentChecksThrowInvalidArgumentWithTheMessageAlone) {
  try {
    LOCKSTEP_CHECK_ARG(1 + 1 == 3, "send: destination {} is not another rank of this group", 5);
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "send: destination 5 is not another rank of this group");
  }
}

}  // namespace
}  // namespace lockstep

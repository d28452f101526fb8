// The one reading of a byte size (option_checks.h: byte_size), which
// `lockstep bench` -b/-e, `lockstep simulate --calibrate-min-bytes` and the
// plain-MPI benchmark programs share. Two copies of it had drifted: one
// threw on bad input, the other returned 0.
#include <lockstep_option_checks/option_checks.h>

#include <gtest/gtest.h>

namespace lockstep::option_checks {
namespace {

TEST(ByteSize, ReadsDigitsWithABinaryUnit) {
  EXPECT_EQ(byte_size("0"), 0u);
  EXPECT_EQ(byte_size("4"), 4u);
  EXPECT_EQ(byte_size("64K"), 64u << 10);
  EXPECT_EQ(byte_size("64k"), 64u << 10);
  EXPECT_EQ(byte_size("32M"), 32u << 20);
  EXPECT_EQ(byte_size("1G"), std::uint64_t{1} << 30);
  EXPECT_EQ(byte_size("1024G"), std::uint64_t{1} << 40);
}

TEST(ByteSize, RefusesWhatIsNotASize) {
  for (const char* text : {"", "K", "-5", "+5", "1.5M", "4T", "M4", "4 K", "0x10", "12Q"})
    EXPECT_FALSE(byte_size(text).has_value()) << text;
}

TEST(ByteSize, RefusesSizesThatWouldWrapAround) {
  EXPECT_FALSE(byte_size("1025G").has_value());
  EXPECT_FALSE(byte_size("99999999999G").has_value());
  EXPECT_FALSE(byte_size("18446744073709551617").has_value());  // 2^64 + 1
  EXPECT_EQ(byte_size("1099511627776"), std::uint64_t{1} << 40);
  EXPECT_FALSE(byte_size("1099511627777").has_value());
}

TEST(ByteSize, TheOptionCheckNamesWhatIsAccepted) {
  const CLI::Validator check = byte_size_option();
  std::string good = "8M";
  EXPECT_EQ(check(good), "");
  std::string bad = "8MB";
  EXPECT_EQ(check(bad), "'8MB' is not a size; use bytes with an optional K, M or G, up to 1024G");
}

}  // namespace
}  // namespace lockstep::option_checks

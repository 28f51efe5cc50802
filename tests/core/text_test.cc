#include "core/text.h"

#include "gtest/gtest.h"

namespace mend {
namespace {

TEST(TextTest, EditDistanceCountsSingleEdits) {
  EXPECT_EQ(EditDistance("", ""), 0u);
  EXPECT_EQ(EditDistance("abc", "abc"), 0u);
  EXPECT_EQ(EditDistance("abc", "abd"), 1u);
  EXPECT_EQ(EditDistance("abc", "ab"), 1u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
}

TEST(TextTest, ParsersTakeWholeStringsOnly) {
  EXPECT_EQ(ParseInt64("42"), 42);
  EXPECT_EQ(ParseInt64("-7"), -7);
  EXPECT_FALSE(ParseInt64("42x"));
  EXPECT_FALSE(ParseInt64(" 42"));
  EXPECT_FALSE(ParseInt64("99999999999999999999"));
  EXPECT_EQ(ParseDouble("0.5"), 0.5);
  EXPECT_FALSE(ParseDouble("0.5.1"));
  EXPECT_FALSE(ParseDouble("1e999"));
  EXPECT_EQ(ParseBool("on"), true);
  EXPECT_EQ(ParseBool("0"), false);
  EXPECT_FALSE(ParseBool("TRUE"));
}

TEST(TextTest, HostPortChecks) {
  EXPECT_TRUE(CheckHostPort("127.0.0.1:0", "a").ok());
  EXPECT_TRUE(CheckHostPort("[::1]:29510", "a").ok());
  EXPECT_TRUE(CheckHostPort("host-1.example:65535", "a").ok());
  EXPECT_FALSE(CheckHostPort(":80", "a").ok());
  EXPECT_FALSE(CheckHostPort("host", "a").ok());
  EXPECT_FALSE(CheckHostPort("host:-1", "a").ok());
  EXPECT_FALSE(CheckHostPort("ho st:80", "a").ok());
  auto [host, port] = SplitHostPort("[::1]:29510");
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 29510);
  EXPECT_EQ(JoinHostPort(host, port), "[::1]:29510");
  EXPECT_EQ(JoinHostPort("127.0.0.1", 80), "127.0.0.1:80");
}

TEST(TextTest, FormatDoubleRoundTrips) {
  for (double value : {0.7, 1e-9, 3.5, 123456.789, 0.1 + 0.2}) {
    EXPECT_EQ(ParseDouble(FormatDouble(value)), value);
  }
}

}  // namespace
}  // namespace mend

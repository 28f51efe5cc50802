#include "core/lighthouse_line.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mend {
namespace {

TEST(LighthouseLineTest, TheServingLineGivesBackItsGrpcAddress) {
  const std::string line = LighthouseServingLine("127.0.0.1:5100", "127.0.0.1:8080");
  EXPECT_EQ(line, "mend lighthouse grpc=127.0.0.1:5100 http=127.0.0.1:8080");
  EXPECT_EQ(GrpcAddressOfServingLine(line).value(), "127.0.0.1:5100");
  // Without the status page.
  EXPECT_EQ(GrpcAddressOfServingLine(LighthouseServingLine("[::1]:7", "")).value(), "[::1]:7");
}

TEST(LighthouseLineTest, AnotherLineIsRefusedQuotingIt) {
  for (const char* line : {"", "mend lighthouse: address in use", "mend lighthouse grpc= http=x",
                           "grpc=127.0.0.1:5100 http=", "mend lighthouse grpc=127.0.0.1:5100"}) {
    auto address = GrpcAddressOfServingLine(line);
    ASSERT_FALSE(address.ok()) << line;
    EXPECT_EQ(address.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(address.status().message()),
                testing::HasSubstr(std::string("'") + line + "'"));
  }
}

}  // namespace
}  // namespace mend

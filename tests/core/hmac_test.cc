#include "core/hmac.h"

#include <algorithm>
#include <string>
#include <string_view>

#include "fmt/format.h"
#include "gtest/gtest.h"

namespace mend {
namespace {

std::string Hex(const Sha256Bytes& bytes) {
  std::string out;
  for (uint8_t b : bytes) out += fmt::format("{:02x}", b);
  return out;
}

// RFC 4231, test case 2: key "Jefe".
constexpr std::string_view kJefe = "Jefe";
constexpr std::string_view kMessage = "what do ya want for nothing?";
constexpr std::string_view kExpected =
    "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";

TEST(HmacTest, DeriveHmacKeyIsHmacSha256OfTheLabelUnderTheSecret) {
  EXPECT_EQ(Hex(DeriveHmacKey(kJefe, kMessage)), kExpected);
}

TEST(HmacTest, AMacFedInPartsIsTheRfcsAndFinalStartsTheNextMessageUnderTheSameKey) {
  Sha256Bytes key{};
  std::copy(kJefe.begin(), kJefe.end(), key.begin());  // (HMAC pads a short key with zeros)
  HmacSha256 hmac(key);
  hmac.Update(kMessage.data(), 10);
  hmac.Update(kMessage.data() + 10, kMessage.size() - 10);
  EXPECT_EQ(Hex(hmac.Final()), kExpected);
  hmac.Update(kMessage.data(), kMessage.size());
  EXPECT_EQ(Hex(hmac.Final()), kExpected) << "the second message carried the first's state";
  hmac.Update("x", 1);
  EXPECT_NE(Hex(hmac.Final()), kExpected);
}

}  // namespace
}  // namespace mend

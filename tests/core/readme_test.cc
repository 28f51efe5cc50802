// The README's configuration table is the one the code generates.
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "mend/config.h"

namespace mend {
namespace {

TEST(ReadmeTest, ConfigurationTableMatchesTheKeyTable) {
  std::ifstream in(MEND_README_PATH);
  ASSERT_TRUE(in) << MEND_README_PATH;
  std::stringstream text;
  text << in.rdbuf();
  std::string readme = text.str();
  const std::string begin = "<!-- config-table:begin -->\n";
  const std::string end = "<!-- config-table:end -->";
  size_t from = readme.find(begin);
  size_t to = readme.find(end);
  ASSERT_NE(from, std::string::npos);
  ASSERT_NE(to, std::string::npos);
  EXPECT_EQ(readme.substr(from + begin.size(), to - from - begin.size()), ConfigMarkdownTable())
      << "regenerate it with: build/mend config keys --markdown";
}

}  // namespace
}  // namespace mend

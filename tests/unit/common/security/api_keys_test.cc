#include "common/security/api_keys.h"

#include <cstdlib>

#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace lamina {
namespace {

TEST(ApiKeysTest, AcceptsExactlyTheKeysOfTheFileAndTheEnvironment) {
  testing::TempDir dir;
  const std::string file = dir.Write("keys", "# team keys\nsk-alpha\n\n  sk-beta  \n");
  ::setenv("LAMINA_API_KEY", "sk-env", 1);
  absl::StatusOr<ApiKeys> keys = ApiKeys::Load(file);
  ::unsetenv("LAMINA_API_KEY");
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_TRUE(keys->enabled());
  EXPECT_EQ(keys->size(), 3u);
  EXPECT_TRUE(keys->Accepts("sk-alpha"));
  EXPECT_TRUE(keys->Accepts("sk-beta"));
  EXPECT_TRUE(keys->Accepts("sk-env"));
  EXPECT_FALSE(keys->Accepts("sk-alph"));
  EXPECT_FALSE(keys->Accepts("sk-alphaa"));
  EXPECT_FALSE(keys->Accepts(""));
  EXPECT_FALSE(keys->Accepts("# team keys"));
}

TEST(ApiKeysTest, NoFileAndNoEnvironmentRequireNothing) {
  ::unsetenv("LAMINA_API_KEY");
  absl::StatusOr<ApiKeys> keys = ApiKeys::Load("");
  ASSERT_TRUE(keys.ok());
  EXPECT_FALSE(keys->enabled());
}

TEST(ApiKeysTest, AnUnreadableOrEmptyFileIsNamed) {
  ::unsetenv("LAMINA_API_KEY");
  absl::StatusOr<ApiKeys> missing = ApiKeys::Load("/nonexistent/keys");
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/keys"), std::string::npos) << missing.status();
  testing::TempDir dir;
  const std::string empty = dir.Write("keys", "# nothing yet\n\n");
  absl::StatusOr<ApiKeys> none = ApiKeys::Load(empty);
  EXPECT_TRUE(absl::IsInvalidArgument(none.status())) << none.status();
  EXPECT_NE(none.status().message().find(empty), std::string::npos) << none.status();
}

TEST(ApiKeysTest, BearerValuesGiveTheirKey) {
  EXPECT_EQ(ApiKeys::FromBearer("Bearer sk-alpha"), "sk-alpha");
  EXPECT_EQ(ApiKeys::FromBearer("Basic dXNlcjpwYXNz"), "");
  EXPECT_EQ(ApiKeys::FromBearer(""), "");
}

}  // namespace
}  // namespace lamina

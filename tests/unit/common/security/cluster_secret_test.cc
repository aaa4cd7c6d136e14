#include "common/security/cluster_secret.h"

#include <cstdlib>

#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace lamina {
namespace {

constexpr char kSecret[] = "a-cluster-secret-of-32-characters";

TEST(ClusterSecretTest, TokensAreAcceptedByTheSameSecretOnlyWithinTheWindow) {
  const ClusterSecret secret(kSecret), other("another-secret-of-the-same-size!");
  const absl::Time now = absl::FromUnixSeconds(1800000000);
  const std::string token = secret.CallToken(now);
  EXPECT_TRUE(secret.CheckCallToken(token, now).ok());
  EXPECT_TRUE(secret.CheckCallToken(token, now + kTokenWindow - absl::Seconds(1)).ok());
  EXPECT_TRUE(absl::IsUnauthenticated(secret.CheckCallToken(token, now + kTokenWindow + absl::Seconds(1))));
  EXPECT_TRUE(absl::IsUnauthenticated(other.CheckCallToken(token, now)));
  EXPECT_TRUE(absl::IsUnauthenticated(secret.CheckCallToken("", now)));
  // A token's time cannot be moved without its MAC changing.
  std::string moved = secret.CallToken(now + absl::Seconds(1));
  moved = token.substr(0, token.find(':')) + moved.substr(moved.find(':'));
  EXPECT_TRUE(absl::IsUnauthenticated(secret.CheckCallToken(moved, now)));
}

TEST(ClusterSecretTest, ALinkProofHoldsForItsNonceUnderTheSameSecretOnly) {
  const ClusterSecret secret(kSecret), other("another-secret-of-the-same-size!");
  const std::string proof = secret.LinkProof("nonce-1");
  EXPECT_EQ(proof.size(), 64u);  // hex HMAC-SHA256
  EXPECT_TRUE(secret.CheckLinkProof("nonce-1", proof));
  EXPECT_FALSE(secret.CheckLinkProof("nonce-2", proof));
  EXPECT_FALSE(other.CheckLinkProof("nonce-1", proof));
  EXPECT_FALSE(secret.CheckLinkProof("nonce-1", ""));
}

TEST(ClusterSecretTest, LoadsTheFileElseTheEnvironmentAndRefusesShortSecrets) {
  testing::TempDir dir;
  ::unsetenv("LAMINA_CLUSTER_SECRET");
  absl::StatusOr<std::optional<ClusterSecret>> none = ClusterSecret::Load("");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());

  const std::string file = dir.Write("secret", std::string(kSecret) + "\n");
  absl::StatusOr<std::optional<ClusterSecret>> from_file = ClusterSecret::Load(file);
  ASSERT_TRUE(from_file.ok() && from_file->has_value()) << from_file.status();
  const absl::Time now = absl::Now();
  EXPECT_TRUE(ClusterSecret(kSecret).CheckCallToken((*from_file)->CallToken(now), now).ok());

  const std::string short_file = dir.Write("short", "tiny\n");
  absl::StatusOr<std::optional<ClusterSecret>> short_secret = ClusterSecret::Load(short_file);
  EXPECT_TRUE(absl::IsInvalidArgument(short_secret.status()));
  EXPECT_NE(short_secret.status().message().find(short_file), std::string::npos);

  ::setenv("LAMINA_CLUSTER_SECRET", kSecret, 1);
  absl::StatusOr<std::optional<ClusterSecret>> from_env = ClusterSecret::Load("");
  ::unsetenv("LAMINA_CLUSTER_SECRET");
  ASSERT_TRUE(from_env.ok() && from_env->has_value());
  EXPECT_TRUE(ClusterSecret(kSecret).CheckCallToken((*from_env)->CallToken(now), now).ok());
}

}  // namespace
}  // namespace lamina

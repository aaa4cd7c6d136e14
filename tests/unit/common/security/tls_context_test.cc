#include "common/security/tls_context.h"

#include <sys/stat.h>

#include "common/security/self_signed.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace lamina {
namespace {

TEST(TlsContextTest, ASelfSignedCertificateServesAndIsTrustedAsItsOwnAuthority) {
  testing::TempDir dir;
  const std::string cert = dir.path() + "/c.pem", key = dir.path() + "/c.key";
  ASSERT_TRUE(WriteSelfSignedCertificate({"127.0.0.1", "localhost"}, 30, cert, key).ok());
  struct stat key_stat;
  ASSERT_EQ(::stat(key.c_str(), &key_stat), 0);
  EXPECT_EQ(key_stat.st_mode & 077, 0u) << "the key is readable by its owner alone";
  EXPECT_TRUE(TlsContext::ForServer(cert, key).ok());
  EXPECT_TRUE(TlsContext::ForClient(cert).ok());
  EXPECT_TRUE(TlsContext::ForClient("").ok()) << "the system's roots";
}

TEST(TlsContextTest, BadFilesAreNamed) {
  testing::TempDir dir;
  const std::string cert = dir.path() + "/c.pem", key = dir.path() + "/c.key";
  const std::string other_cert = dir.path() + "/o.pem", other_key = dir.path() + "/o.key";
  ASSERT_TRUE(WriteSelfSignedCertificate({"localhost"}, 30, cert, key).ok());
  ASSERT_TRUE(WriteSelfSignedCertificate({"localhost"}, 30, other_cert, other_key).ok());
  const std::string junk = dir.Write("junk.pem", "not a certificate\n");

  absl::StatusOr<std::shared_ptr<const TlsContext>> missing = TlsContext::ForServer(dir.path() + "/none.pem", key);
  EXPECT_TRUE(absl::IsInvalidArgument(missing.status()));
  EXPECT_NE(missing.status().message().find("none.pem: no such file"), std::string::npos) << missing.status();

  absl::StatusOr<std::shared_ptr<const TlsContext>> garbled = TlsContext::ForServer(junk, key);
  EXPECT_NE(garbled.status().message().find("junk.pem"), std::string::npos) << garbled.status();

  absl::StatusOr<std::shared_ptr<const TlsContext>> mismatched = TlsContext::ForServer(cert, other_key);
  EXPECT_TRUE(absl::IsInvalidArgument(mismatched.status()));
  EXPECT_NE(mismatched.status().message().find("not the private key of"), std::string::npos) << mismatched.status();

  absl::StatusOr<std::shared_ptr<const TlsContext>> bad_ca = TlsContext::ForClient(junk);
  EXPECT_NE(bad_ca.status().message().find("junk.pem"), std::string::npos) << bad_ca.status();
}

TEST(TlsContextTest, ACertificateNeedsAHost) {
  testing::TempDir dir;
  EXPECT_TRUE(absl::IsInvalidArgument(
      WriteSelfSignedCertificate({}, 30, dir.path() + "/c.pem", dir.path() + "/c.key")));
}

}  // namespace
}  // namespace lamina

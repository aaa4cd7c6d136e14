#include "common/security/cluster_secret.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"

namespace lamina {
namespace {

bool SameText(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

absl::StatusOr<std::optional<ClusterSecret>> ClusterSecret::Load(const std::string& secret_file) {
  std::string secret;
  if (!secret_file.empty()) {
    std::ifstream in(secret_file);
    if (!in) return absl::NotFoundError(absl::StrCat(secret_file, ": cannot read the cluster secret file"));
    std::getline(in, secret);
    secret = std::string(absl::StripAsciiWhitespace(secret));
    if (secret.size() < 16) {
      return absl::InvalidArgumentError(
          absl::StrCat(secret_file, ": the cluster secret must be at least 16 characters on its first line"));
    }
  } else if (const char* env = std::getenv("LAMINA_CLUSTER_SECRET"); env != nullptr && *env != '\0') {
    secret = env;
    if (secret.size() < 16) return absl::InvalidArgumentError("LAMINA_CLUSTER_SECRET must be at least 16 characters");
  } else {
    return std::optional<ClusterSecret>();
  }
  return std::optional<ClusterSecret>(ClusterSecret(std::move(secret)));
}

std::string ClusterSecret::Mac(absl::string_view message) const {
  unsigned char mac[32];
  unsigned int length = 0;
  HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &length);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(mac), length));
}

std::string ClusterSecret::CallToken(absl::Time now) const {
  const std::string ms = absl::StrCat(absl::ToUnixMillis(now));
  return absl::StrCat(ms, ":", Mac(absl::StrCat("lamina-call:", ms)));
}

absl::Status ClusterSecret::CheckCallToken(absl::string_view token, absl::Time now) const {
  const size_t colon = token.find(':');
  int64_t ms = 0;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(token.substr(0, colon), &ms)) {
    return absl::UnauthenticatedError("the call carries no cluster credential");
  }
  if (absl::AbsDuration(now - absl::FromUnixMillis(ms)) > kTokenWindow) {
    return absl::UnauthenticatedError("the call's cluster credential is stale (are the hosts' clocks apart?)");
  }
  if (!SameText(token.substr(colon + 1), Mac(absl::StrCat("lamina-call:", token.substr(0, colon))))) {
    return absl::UnauthenticatedError("the call's cluster credential is wrong (another cluster's secret?)");
  }
  return absl::OkStatus();
}

std::string ClusterSecret::LinkProof(absl::string_view nonce) const {
  return Mac(absl::StrCat("lamina-link:", nonce));
}

bool ClusterSecret::CheckLinkProof(absl::string_view nonce, absl::string_view proof) const {
  return SameText(proof, LinkProof(nonce));
}

}  // namespace lamina

#include "common/security/cluster_secret.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>
#include <fstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/transport/transport.h"

namespace lamina {
namespace {

constexpr uint32_t kChallenge = 0x4c434831;  // "LCH1": the nonce, then the answer back
constexpr size_t kNonceBytes = 32;

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

absl::Status ClusterSecret::Challenge(Connection& connection, absl::Time deadline) const {
  std::vector<uint8_t> nonce(kNonceBytes);
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    return absl::InternalError("no randomness for a cluster challenge");
  }
  const ByteSpan part(nonce);
  LAMINA_RETURN_IF_ERROR(connection.Send({kChallenge, 0, 0}, {&part, 1}));
  MessageHeader header;
  std::vector<uint8_t> answer;
  LAMINA_RETURN_IF_ERROR(connection.Receive(&header, &answer, deadline));
  const std::string want = Mac(absl::StrCat(
      "lamina-link:", absl::string_view(reinterpret_cast<const char*>(nonce.data()), nonce.size())));
  if (header.type != kChallenge ||
      !SameText(absl::string_view(reinterpret_cast<const char*>(answer.data()), answer.size()), want)) {
    connection.Close();
    return absl::UnauthenticatedError(
        absl::StrCat(connection.peer(), " did not prove it holds the cluster secret: refused"));
  }
  return absl::OkStatus();
}

absl::Status ClusterSecret::Answer(Connection& connection, absl::Time deadline) const {
  MessageHeader header;
  std::vector<uint8_t> nonce;
  LAMINA_RETURN_IF_ERROR(connection.Receive(&header, &nonce, deadline));
  if (header.type != kChallenge || nonce.size() != kNonceBytes) {
    connection.Close();
    return absl::UnauthenticatedError(absl::StrCat(connection.peer(), " sent no cluster challenge: does it hold "
                                                   "the same cluster secret setting?"));
  }
  const std::string answer = Mac(
      absl::StrCat("lamina-link:", absl::string_view(reinterpret_cast<const char*>(nonce.data()), nonce.size())));
  const ByteSpan part(reinterpret_cast<const uint8_t*>(answer.data()), answer.size());
  return connection.Send({kChallenge, 0, 0}, {&part, 1});
}

}  // namespace lamina

#include "common/transport/link_handshake.h"

#include <openssl/rand.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status/status_macros.h"

namespace lamina {
namespace {

constexpr uint32_t kChallenge = 0x4c434831;  // "LCH1": the nonce, then the answer back
constexpr size_t kNonceBytes = 32;

absl::string_view Text(const std::vector<uint8_t>& bytes) {
  return absl::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

}  // namespace

absl::Status ChallengePeer(const ClusterSecret& secret, Connection& connection, absl::Time deadline) {
  std::vector<uint8_t> nonce(kNonceBytes);
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    return absl::InternalError("no randomness for a cluster challenge");
  }
  const ByteSpan part(nonce);
  LAMINA_RETURN_IF_ERROR(connection.Send({kChallenge, 0, 0}, {&part, 1}));
  MessageHeader header;
  std::vector<uint8_t> answer;
  LAMINA_RETURN_IF_ERROR(connection.Receive(&header, &answer, deadline));
  if (header.type != kChallenge || !secret.CheckLinkProof(Text(nonce), Text(answer))) {
    connection.Close();
    return absl::UnauthenticatedError(
        absl::StrCat(connection.peer(), " did not prove it holds the cluster secret: refused"));
  }
  return absl::OkStatus();
}

absl::Status AnswerChallenge(const ClusterSecret& secret, Connection& connection, absl::Time deadline) {
  MessageHeader header;
  std::vector<uint8_t> nonce;
  LAMINA_RETURN_IF_ERROR(connection.Receive(&header, &nonce, deadline));
  if (header.type != kChallenge || nonce.size() != kNonceBytes) {
    connection.Close();
    return absl::UnauthenticatedError(absl::StrCat(connection.peer(), " sent no cluster challenge: does it hold "
                                                   "the same cluster secret setting?"));
  }
  const std::string answer = secret.LinkProof(Text(nonce));
  const ByteSpan part(reinterpret_cast<const uint8_t*>(answer.data()), answer.size());
  return connection.Send({kChallenge, 0, 0}, {&part, 1});
}

}  // namespace lamina

// The secret every process of a cluster holds (the topology's `cluster_secret_file`, or the
// LAMINA_CLUSTER_SECRET environment variable), and how a peer proves it holds it without sending
// it:
//  - on gRPC, each internal call carries `lamina-cluster-auth: <unix ms>:<hex HMAC-SHA256(secret,
//    "lamina-call:" + unix ms)>`, accepted within kTokenWindow of the receiver's clock;
//  - on a data-plane connection, the accepting end sends a random nonce and the connecting end
//    answers HMAC-SHA256(secret, "lamina-link:" + nonce) before anything else is read.
// With no secret configured nothing is checked (a cluster on loopback or a trusted network).
// Neither encrypts: rows and calls travel in the clear (keep the cluster's network private).
// Thread-safe once made.
#ifndef LAMINA_COMMON_SECURITY_CLUSTER_SECRET_H_
#define LAMINA_COMMON_SECURITY_CLUSTER_SECRET_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace lamina {

inline constexpr char kClusterAuthMetadata[] = "lamina-cluster-auth";
inline constexpr absl::Duration kTokenWindow = absl::Minutes(5);

class ClusterSecret {
 public:
  // The secret of `secret_file` (its first line, at least 16 bytes), or else of
  // LAMINA_CLUSTER_SECRET; nullopt when neither is set. NotFound or InvalidArgument naming the file.
  static absl::StatusOr<std::optional<ClusterSecret>> Load(const std::string& secret_file);
  explicit ClusterSecret(std::string secret) : secret_(std::move(secret)) {}

  // gRPC: the token a call carries at `now`, and the check of one received.
  std::string CallToken(absl::Time now) const;
  absl::Status CheckCallToken(absl::string_view token, absl::Time now) const;

  // A data-plane connection's proof for the accepting end's `nonce` (common/transport/
  // link_handshake.h carries it), and its check, in constant time.
  std::string LinkProof(absl::string_view nonce) const;
  bool CheckLinkProof(absl::string_view nonce, absl::string_view proof) const;

 private:
  std::string Mac(absl::string_view message) const;  // hex HMAC-SHA256
  std::string secret_;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_SECURITY_CLUSTER_SECRET_H_

// A data-plane connection's proof of the cluster secret (common/security/cluster_secret.h), before
// anything else crosses it: the accepting end sends a random nonce and the connecting end answers
// ClusterSecret::LinkProof(nonce). Each end's half; Unauthenticated (and the connection closed)
// when the peer does not prove the secret; DeadlineExceeded past `deadline`.
// Thread-compatible, as the connection's Send and Receive are.
#ifndef LAMINA_COMMON_TRANSPORT_LINK_HANDSHAKE_H_
#define LAMINA_COMMON_TRANSPORT_LINK_HANDSHAKE_H_

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/security/cluster_secret.h"
#include "common/transport/transport.h"

namespace lamina {

absl::Status ChallengePeer(const ClusterSecret& secret, Connection& connection, absl::Time deadline);
absl::Status AnswerChallenge(const ClusterSecret& secret, Connection& connection, absl::Time deadline);

}  // namespace lamina

#endif  // LAMINA_COMMON_TRANSPORT_LINK_HANDSHAKE_H_

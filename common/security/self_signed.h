// A self-signed certificate and its key, for a cluster that has no certificate authority of its
// own (`lamina cert`, and tests): an ECDSA P-256 key, a certificate valid for `days` naming
// `hosts` (DNS names or IPv4 addresses) as its subject's alternative names. Clients trust it by
// being given the certificate itself as their CA file.
#ifndef LAMINA_COMMON_SECURITY_SELF_SIGNED_H_
#define LAMINA_COMMON_SECURITY_SELF_SIGNED_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace lamina {

// Writes the certificate to `cert_file` and the key to `key_file` (PEM, the key readable by its
// owner only). InvalidArgument when `hosts` is empty, Internal naming a file that cannot be written.
absl::Status WriteSelfSignedCertificate(const std::vector<std::string>& hosts, int days, const std::string& cert_file,
                                        const std::string& key_file);

}  // namespace lamina

#endif  // LAMINA_COMMON_SECURITY_SELF_SIGNED_H_

// Client API keys: the coordinator serves a request only when it presents one of them
// (HTTP `Authorization: Bearer KEY`, gRPC metadata `authorization: Bearer KEY`). Keys come from a
// file (one a line; blank lines and lines starting with '#' are skipped) and from the
// LAMINA_API_KEY environment variable. Comparison takes the same time whichever key, or how much
// of one, matches; keys are never logged. Thread-safe once made.
#ifndef LAMINA_COMMON_SECURITY_API_KEYS_H_
#define LAMINA_COMMON_SECURITY_API_KEYS_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lamina {

class ApiKeys {
 public:
  // The keys of `key_file` (none when empty) and of LAMINA_API_KEY; NotFound or InvalidArgument
  // naming the file when it cannot be read or holds no key.
  static absl::StatusOr<ApiKeys> Load(const std::string& key_file);
  // Keys given outright (tests).
  static ApiKeys Of(const std::vector<std::string>& keys);

  // Whether any key is required at all.
  bool enabled() const { return !digests_.empty(); }
  // Whether `presented` is one of the keys.
  bool Accepts(absl::string_view presented) const;
  // The key of an `Authorization: Bearer KEY` value ("" when it is not one).
  static absl::string_view FromBearer(absl::string_view authorization);
  size_t size() const { return digests_.size(); }

 private:
  std::vector<std::array<uint8_t, 32>> digests_;  // SHA-256 of each key
};

}  // namespace lamina

#endif  // LAMINA_COMMON_SECURITY_API_KEYS_H_

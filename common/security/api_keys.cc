#include "common/security/api_keys.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace lamina {
namespace {

std::array<uint8_t, 32> Digest(absl::string_view text) {
  std::array<uint8_t, 32> out;
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), out.data());
  return out;
}

}  // namespace

absl::StatusOr<ApiKeys> ApiKeys::Load(const std::string& key_file) {
  std::vector<std::string> keys;
  if (!key_file.empty()) {
    std::ifstream in(key_file);
    if (!in) return absl::NotFoundError(absl::StrCat(key_file, ": cannot read the API key file"));
    std::string line;
    while (std::getline(in, line)) {
      const std::string key(absl::StripAsciiWhitespace(line));
      if (!key.empty() && key[0] != '#') keys.push_back(key);
    }
    if (keys.empty()) return absl::InvalidArgumentError(absl::StrCat(key_file, ": the API key file holds no key"));
  }
  if (const char* env = std::getenv("LAMINA_API_KEY"); env != nullptr && *env != '\0') keys.push_back(env);
  return Of(keys);
}

ApiKeys ApiKeys::Of(const std::vector<std::string>& keys) {
  ApiKeys out;
  for (const std::string& key : keys) out.digests_.push_back(Digest(key));
  return out;
}

bool ApiKeys::Accepts(absl::string_view presented) const {
  // Digests of equal length, compared in constant time, every key looked at.
  const std::array<uint8_t, 32> digest = Digest(presented);
  bool found = false;
  for (const std::array<uint8_t, 32>& key : digests_) {
    found |= CRYPTO_memcmp(key.data(), digest.data(), key.size()) == 0;
  }
  return found && !presented.empty();
}

absl::string_view ApiKeys::FromBearer(absl::string_view authorization) {
  authorization = absl::StripAsciiWhitespace(authorization);
  if (!absl::StartsWithIgnoreCase(authorization, "bearer ")) return {};
  return absl::StripAsciiWhitespace(authorization.substr(7));
}

}  // namespace lamina

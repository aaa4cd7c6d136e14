#include "common/security/tls_context.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"

namespace lamina {
namespace {

absl::StatusOr<SSL_CTX*> NewContext(const SSL_METHOD* method) {
  SSL_CTX* context = SSL_CTX_new(method);
  if (context == nullptr) return absl::InternalError(TakeOpenSslErrors("cannot create a TLS context"));
  SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION);
  // Partial writes, and a write buffer that may move between retries: SocketStream retries a
  // write after waiting for the socket with whatever is left to send.
  SSL_CTX_set_mode(context, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // A peer that closes without a close_notify reads as closed; HTTP's framing tells a whole
  // message from a cut one.
  SSL_CTX_set_options(context, SSL_OP_IGNORE_UNEXPECTED_EOF);
  return context;
}

absl::Status FileError(const std::string& file, const std::string& what) {
  if (!std::filesystem::exists(file)) return absl::InvalidArgumentError(absl::StrCat(file, ": no such file"));
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", TakeOpenSslErrors(what)));
}

}  // namespace

std::string TakeOpenSslErrors(const std::string& fallback) {
  std::string text;
  while (unsigned long code = ERR_get_error()) {
    char line[256];
    ERR_error_string_n(code, line, sizeof(line));
    absl::StrAppend(&text, text.empty() ? "" : "; ", line);
  }
  return text.empty() ? fallback : absl::StrCat(fallback, " (", text, ")");
}

absl::StatusOr<std::shared_ptr<const TlsContext>> TlsContext::ForServer(const std::string& cert_file,
                                                                       const std::string& key_file) {
  ERR_clear_error();
  absl::StatusOr<SSL_CTX*> made = NewContext(TLS_server_method());
  if (!made.ok()) return made.status();
  std::shared_ptr<const TlsContext> context(new TlsContext(*made));
  if (SSL_CTX_use_certificate_chain_file(*made, cert_file.c_str()) != 1) {
    return FileError(cert_file, "not a PEM certificate chain");
  }
  std::unique_ptr<FILE, int (*)(FILE*)> key_in(std::fopen(key_file.c_str(), "r"), std::fclose);
  if (key_in == nullptr) return FileError(key_file, "cannot be read");
  std::unique_ptr<EVP_PKEY, void (*)(EVP_PKEY*)> key(
      PEM_read_PrivateKey(key_in.get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
  if (key == nullptr) return FileError(key_file, "not a PEM private key");
  if (SSL_CTX_use_PrivateKey(*made, key.get()) != 1 || SSL_CTX_check_private_key(*made) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(key_file, ": ", TakeOpenSslErrors(absl::StrCat("not the private key of ", cert_file))));
  }
  return context;
}

absl::StatusOr<std::shared_ptr<const TlsContext>> TlsContext::ForClient(const std::string& ca_file) {
  ERR_clear_error();
  absl::StatusOr<SSL_CTX*> made = NewContext(TLS_client_method());
  if (!made.ok()) return made.status();
  std::shared_ptr<const TlsContext> context(new TlsContext(*made));
  SSL_CTX_set_verify(*made, SSL_VERIFY_PEER, nullptr);
  if (ca_file.empty()) {
    if (SSL_CTX_set_default_verify_paths(*made) != 1) {
      return absl::InternalError(TakeOpenSslErrors("cannot load the system's trusted certificates"));
    }
  } else if (SSL_CTX_load_verify_locations(*made, ca_file.c_str(), nullptr) != 1) {
    return FileError(ca_file, "not a PEM certificate file");
  }
  return context;
}

TlsContext::~TlsContext() { SSL_CTX_free(context_); }

}  // namespace lamina

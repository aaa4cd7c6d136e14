#include "common/security/self_signed.h"

#include <arpa/inet.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/security/tls_context.h"

namespace lamina {
namespace {

struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct CertificateFree {
  void operator()(X509* certificate) const { X509_free(certificate); }
};
struct ExtensionFree {
  void operator()(X509_EXTENSION* extension) const { X509_EXTENSION_free(extension); }
};
struct FileClose {
  void operator()(FILE* file) const { std::fclose(file); }
};

absl::Status AddExtension(X509* certificate, int nid, const std::string& value) {
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, certificate, certificate, nullptr, nullptr, 0);
  std::unique_ptr<X509_EXTENSION, ExtensionFree> extension(X509V3_EXT_conf_nid(nullptr, &context, nid, value.c_str()));
  if (extension == nullptr || X509_add_ext(certificate, extension.get(), -1) != 1) {
    return absl::InternalError(TakeOpenSslErrors(absl::StrCat("cannot add '", value, "' to a certificate")));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteSelfSignedCertificate(const std::vector<std::string>& hosts, int days, const std::string& cert_file,
                                        const std::string& key_file) {
  if (hosts.empty()) return absl::InvalidArgumentError("a certificate needs at least one host name or address");
  std::unique_ptr<EVP_PKEY, KeyFree> key(EVP_EC_gen("P-256"));
  std::unique_ptr<X509, CertificateFree> certificate(X509_new());
  if (key == nullptr || certificate == nullptr) {
    return absl::InternalError(TakeOpenSslErrors("cannot make a key and certificate"));
  }
  X509_set_version(certificate.get(), 2);  // v3, for the extensions
  unsigned char serial[16];
  std::unique_ptr<BIGNUM, decltype(&BN_free)> number(BN_new(), BN_free);
  if (RAND_bytes(serial, sizeof(serial)) != 1 || BN_bin2bn(serial, sizeof(serial), number.get()) == nullptr ||
      BN_to_ASN1_INTEGER(number.get(), X509_get_serialNumber(certificate.get())) == nullptr) {
    return absl::InternalError(TakeOpenSslErrors("cannot draw a certificate serial number"));
  }
  X509_gmtime_adj(X509_getm_notBefore(certificate.get()), -3600);  // tolerates clocks a little behind
  X509_gmtime_adj(X509_getm_notAfter(certificate.get()), static_cast<long>(days) * 24 * 3600);
  X509_set_pubkey(certificate.get(), key.get());
  X509_NAME* name = X509_get_subject_name(certificate.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("Lamina"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(hosts[0].c_str()), -1, -1,
                             0);
  X509_set_issuer_name(certificate.get(), name);
  std::string names;
  for (const std::string& host : hosts) {
    in_addr ip;
    absl::StrAppend(&names, names.empty() ? "" : ",", ::inet_pton(AF_INET, host.c_str(), &ip) == 1 ? "IP:" : "DNS:",
                    host);
  }
  absl::Status added = AddExtension(certificate.get(), NID_subject_alt_name, names);
  if (added.ok()) added = AddExtension(certificate.get(), NID_basic_constraints, "critical,CA:TRUE");
  if (added.ok()) added = AddExtension(certificate.get(), NID_subject_key_identifier, "hash");
  if (!added.ok()) return added;
  if (X509_sign(certificate.get(), key.get(), EVP_sha256()) == 0) {
    return absl::InternalError(TakeOpenSslErrors("cannot sign the certificate"));
  }

  const mode_t old_mask = ::umask(077);  // the key: its owner's alone
  std::unique_ptr<FILE, FileClose> key_out(std::fopen(key_file.c_str(), "w"));
  ::umask(old_mask);
  if (key_out == nullptr) return absl::InternalError(absl::StrCat(key_file, ": cannot be written"));
  if (PEM_write_PrivateKey(key_out.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return absl::InternalError(TakeOpenSslErrors(absl::StrCat(key_file, ": cannot be written")));
  }
  std::unique_ptr<FILE, FileClose> cert_out(std::fopen(cert_file.c_str(), "w"));
  if (cert_out == nullptr || PEM_write_X509(cert_out.get(), certificate.get()) != 1) {
    return absl::InternalError(TakeOpenSslErrors(absl::StrCat(cert_file, ": cannot be written")));
  }
  return absl::OkStatus();
}

}  // namespace lamina

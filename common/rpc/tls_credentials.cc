#include "common/rpc/tls_credentials.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"

namespace lamina {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot be read"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(const ServerTlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  // OpenSSL's check first: gRPC would only fail to start, without saying which file is wrong.
  LAMINA_RETURN_IF_ERROR(TlsContext::ForServer(files.cert_file, files.key_file).status());
  grpc::SslServerCredentialsOptions options;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  LAMINA_ASSIGN_OR_RETURN(pair.private_key, ReadPem(files.key_file));
  LAMINA_ASSIGN_OR_RETURN(pair.cert_chain, ReadPem(files.cert_file));
  options.pem_key_cert_pairs.push_back(std::move(pair));
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> GrpcChannelCredentials(const ClientTls& tls) {
  if (!tls.enabled) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  if (!tls.ca_file.empty()) {
    LAMINA_RETURN_IF_ERROR(TlsContext::ForClient(tls.ca_file).status());
    LAMINA_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem(tls.ca_file));
  }
  return grpc::SslCredentials(options);
}

}  // namespace lamina

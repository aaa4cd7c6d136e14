#include "deploy/cli/cert_command.h"

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/flags/flags.h"
#include "common/security/self_signed.h"
#include "common/status/status_macros.h"

namespace lamina::cli {

const char kCertUsage[] =
    "usage: lamina cert --host NAME_OR_IP [--host ...] [--out DIR] [--days N]\n"
    "  Writes a self-signed certificate (DIR/coordinator.pem) and its key (DIR/coordinator.key,\n"
    "  readable by you alone) naming each --host, for `coordinator.tls` in a topology. Clients\n"
    "  trust the certificate itself (--tls-ca DIR/coordinator.pem).\n"
    "  --out DIR   where to write them (default: the current folder); existing files are kept\n"
    "  --days N    how long the certificate is valid (default 365)\n";

namespace {

absl::Status Cert(const std::vector<std::string>& args) {
  LAMINA_ASSIGN_OR_RETURN(Flags flags, Flags::Parse(args, {"host", "out", "days"}, {}));
  const std::vector<std::string> hosts = flags.All("host");
  if (hosts.empty()) return absl::InvalidArgumentError("--host is required (the coordinator's names and addresses)");
  LAMINA_ASSIGN_OR_RETURN(int64_t days, flags.Int("days", 365));
  if (days < 1 || days > 3650) return absl::InvalidArgumentError("--days must be between 1 and 3650");
  const std::filesystem::path out = flags.String("out", ".");
  std::error_code error;
  std::filesystem::create_directories(out, error);
  const std::string cert = (out / "coordinator.pem").string(), key = (out / "coordinator.key").string();
  for (const std::string& file : {cert, key}) {
    if (std::filesystem::exists(file)) {
      return absl::AlreadyExistsError(absl::StrCat(file, " exists; remove it first or choose another --out"));
    }
  }
  LAMINA_RETURN_IF_ERROR(WriteSelfSignedCertificate(hosts, static_cast<int>(days), cert, key));
  std::printf("wrote %s and %s\n", cert.c_str(), key.c_str());
  std::printf("in the topology:  coordinator: {tls: {cert: %s, key: %s}}\n", cert.c_str(), key.c_str());
  std::printf("clients:          lamina generate --endpoint HOST:PORT --tls-ca %s ...\n", cert.c_str());
  return absl::OkStatus();
}

}  // namespace

int RunCert(const std::vector<std::string>& args) {
  absl::Status status = Cert(args);
  if (status.ok()) return 0;
  std::fprintf(stderr, "lamina cert: %s\n", std::string(status.message()).c_str());
  return absl::IsInvalidArgument(status) ? 2 : 1;
}

}  // namespace lamina::cli

#include "deploy/cli/k8s_command.h"

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/flags/flags.h"
#include "common/status/status_macros.h"
#include "common/topology/topology.h"
#include "deploy/k8s/manifests.h"

namespace lamina::cli {

const char kK8sUsage[] =
    "usage: lamina k8s TOPOLOGY.yaml [--image IMAGE] [--namespace NS] [--models-claim PVC] [--prefix P]\n"
    "                  [--out FILE]\n"
    "  Writes Kubernetes manifests for the topology: a ConfigMap with it, and a Deployment and a\n"
    "  Service per process, GPU requests for nodes on GPUs, probes on gRPC health. Apply them with\n"
    "  `kubectl apply -f FILE` (docs/deploy.md says what they need).\n"
    "  --image IMAGE       the image with Lamina's programs (default lamina:latest; build it with\n"
    "                      deploy/container/Containerfile)\n"
    "  --models-claim PVC  a PersistentVolumeClaim whose root holds the model folder (default\n"
    "                      lamina-models)\n"
    "  --prefix P          of every object's name (default lamina)\n"
    "  --out FILE          where to write them (default: standard output)\n";

namespace {

absl::Status K8s(const std::vector<std::string>& args) {
  if (args.empty() || args[0].rfind("--", 0) == 0) return absl::InvalidArgumentError("missing TOPOLOGY.yaml");
  LAMINA_ASSIGN_OR_RETURN(Flags flags, Flags::Parse({args.begin() + 1, args.end()},
                                                    {"image", "namespace", "models-claim", "prefix", "out"}, {}));
  LAMINA_ASSIGN_OR_RETURN(Topology topology, LoadTopology(args[0]));
  k8s::ManifestOptions options;
  options.image = flags.String("image", options.image);
  options.namespace_name = flags.String("namespace", "");
  options.models_claim = flags.String("models-claim", options.models_claim);
  options.prefix = flags.String("prefix", options.prefix);
  LAMINA_ASSIGN_OR_RETURN(std::string manifests, k8s::Manifests(topology, options));
  if (!flags.Has("out")) {
    std::fputs(manifests.c_str(), stdout);
    return absl::OkStatus();
  }
  const std::string path = flags.String("out", "");
  std::ofstream out(path);
  out << manifests;
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot be written"));
  std::fprintf(stderr, "lamina k8s: wrote %s; apply with: kubectl apply -f %s\n", path.c_str(), path.c_str());
  return absl::OkStatus();
}

}  // namespace

int RunK8s(const std::vector<std::string>& args) {
  absl::Status status = K8s(args);
  if (status.ok()) return 0;
  std::fprintf(stderr, "lamina k8s: %s\n", std::string(status.message()).c_str());
  return absl::IsInvalidArgument(status) || absl::IsNotFound(status) ? 2 : 1;
}

}  // namespace lamina::cli

// Kubernetes manifests for a topology (`lamina k8s`): the topology as a ConfigMap, with each
// process's host replaced by its Service's name, its model under the models volume and GPU
// devices as cuda:0 (a pod sees the GPU it requested); a Deployment and a Service per process
// (coordinator, compute and memory nodes), each container listening on every interface
// (LAMINA_LISTEN_HOST=0.0.0.0); GPU requests for nodes on GPUs; readiness on the standard gRPC
// health service (the coordinator's is NOT_SERVING while it cannot serve) and liveness on the
// gRPC port. Files the topology names (API keys, the cluster secret, TLS) are read from the
// Secret `<prefix>-secrets`, which the user makes from those files.
// Thread-safe: pure functions.
#ifndef LAMINA_DEPLOY_K8S_MANIFESTS_H_
#define LAMINA_DEPLOY_K8S_MANIFESTS_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/topology/topology.h"

namespace lamina::k8s {

struct ManifestOptions {
  std::string image = "lamina:latest";      // built from deploy/container/Containerfile
  std::string prefix = "lamina";            // of every object's name
  std::string namespace_name;               // empty: the kubectl context's
  std::string models_claim = "lamina-models";  // a PersistentVolumeClaim holding model folders
};

// The manifests as one multi-document YAML text. InvalidArgument names a node whose name is not
// a valid Kubernetes name (lowercase letters, digits and '-').
absl::StatusOr<std::string> Manifests(const Topology& topology, const ManifestOptions& options);

}  // namespace lamina::k8s

#endif  // LAMINA_DEPLOY_K8S_MANIFESTS_H_

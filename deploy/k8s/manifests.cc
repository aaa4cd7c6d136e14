#include "deploy/k8s/manifests.h"

#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/topology/relocated_topology.h"
#include "yaml-cpp/yaml.h"

namespace lamina::k8s {
namespace {

constexpr char kConfigDir[] = "/etc/lamina";
constexpr char kSecretsDir[] = "/etc/lamina/secrets";
constexpr char kModelsDir[] = "/models";

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 50 || name.front() == '-' || name.back() == '-') return false;
  for (char c : name) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '-') return false;
  }
  return true;
}

// One process: its name, program, arguments, ports and GPU.
struct Process {
  std::string name;  // the object's, e.g. "lamina-memory-0"
  std::string program;
  std::vector<std::string> args;
  std::vector<std::pair<std::string, int>> ports;  // (name, port); the first is gRPC
  bool gpu = false;
};

YAML::Node Metadata(const std::string& name, const ManifestOptions& options, const std::string& component) {
  YAML::Node metadata;
  metadata["name"] = name;
  if (!options.namespace_name.empty()) metadata["namespace"] = options.namespace_name;
  metadata["labels"]["app.kubernetes.io/name"] = options.prefix;
  metadata["labels"]["app.kubernetes.io/component"] = component;
  return metadata;
}

YAML::Node Deployment(const Process& p, const ManifestOptions& options, bool has_secrets) {
  YAML::Node d;
  d["apiVersion"] = "apps/v1";
  d["kind"] = "Deployment";
  d["metadata"] = Metadata(p.name, options, p.name);
  d["spec"]["replicas"] = 1;
  d["spec"]["strategy"]["type"] = "Recreate";  // one process of each name at a time
  d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] = p.name;
  YAML::Node pod = d["spec"]["template"];
  pod["metadata"]["labels"]["app.kubernetes.io/name"] = options.prefix;
  pod["metadata"]["labels"]["app.kubernetes.io/component"] = p.name;
  YAML::Node c;
  c["name"] = p.program;
  c["image"] = options.image;
  c["command"].push_back(p.program);
  for (const std::string& arg : p.args) c["command"].push_back(arg);
  YAML::Node env;
  env["name"] = "LAMINA_LISTEN_HOST";
  env["value"] = "0.0.0.0";
  c["env"].push_back(env);
  for (const auto& [name, port] : p.ports) {
    YAML::Node container_port;
    container_port["name"] = name;
    container_port["containerPort"] = port;
    c["ports"].push_back(container_port);
  }
  const int grpc = p.ports.front().second;
  c["readinessProbe"]["grpc"]["port"] = grpc;
  c["readinessProbe"]["periodSeconds"] = 5;
  c["livenessProbe"]["tcpSocket"]["port"] = grpc;
  c["livenessProbe"]["periodSeconds"] = 10;
  c["livenessProbe"]["failureThreshold"] = 6;
  // Loading a model takes a while: up to 30 minutes before liveness counts.
  c["startupProbe"]["tcpSocket"]["port"] = grpc;
  c["startupProbe"]["periodSeconds"] = 10;
  c["startupProbe"]["failureThreshold"] = 180;
  if (p.gpu) c["resources"]["limits"]["nvidia.com/gpu"] = 1;
  YAML::Node config_mount;
  config_mount["name"] = "topology";
  config_mount["mountPath"] = kConfigDir;
  config_mount["readOnly"] = true;
  c["volumeMounts"].push_back(config_mount);
  YAML::Node models_mount;
  models_mount["name"] = "models";
  models_mount["mountPath"] = kModelsDir;
  models_mount["readOnly"] = true;
  c["volumeMounts"].push_back(models_mount);
  YAML::Node config_volume, models_volume;
  config_volume["name"] = "topology";
  config_volume["configMap"]["name"] = options.prefix + "-topology";
  models_volume["name"] = "models";
  models_volume["persistentVolumeClaim"]["claimName"] = options.models_claim;
  models_volume["persistentVolumeClaim"]["readOnly"] = true;
  pod["spec"]["volumes"].push_back(config_volume);
  pod["spec"]["volumes"].push_back(models_volume);
  if (has_secrets) {
    YAML::Node secrets_mount, secrets_volume;
    secrets_mount["name"] = "secrets";
    secrets_mount["mountPath"] = kSecretsDir;
    secrets_mount["readOnly"] = true;
    c["volumeMounts"].push_back(secrets_mount);
    secrets_volume["name"] = "secrets";
    secrets_volume["secret"]["secretName"] = options.prefix + "-secrets";
    pod["spec"]["volumes"].push_back(secrets_volume);
  }
  pod["spec"]["containers"].push_back(c);
  return d;
}

YAML::Node Service(const Process& p, const ManifestOptions& options) {
  YAML::Node s;
  s["apiVersion"] = "v1";
  s["kind"] = "Service";
  s["metadata"] = Metadata(p.name, options, p.name);
  s["spec"]["selector"]["app.kubernetes.io/component"] = p.name;
  for (const auto& [name, port] : p.ports) {
    YAML::Node service_port;
    service_port["name"] = name;
    service_port["port"] = port;
    service_port["targetPort"] = port;
    s["spec"]["ports"].push_back(service_port);
  }
  return s;
}

}  // namespace

absl::StatusOr<std::string> Manifests(const Topology& topology, const ManifestOptions& options) {
  for (const NodeSpec& node : topology.nodes) {
    if (node.tensor_parallel > 1) {
      // Its ranks share the entry's host, which here would be one pod's service.
      return absl::UnimplementedError(absl::StrCat(topology.path, ":", node.line, ": node '", node.tp_group,
                                                   "': tensor-parallel groups are not yet placed by `lamina k8s` "
                                                   "(they run under `lamina up` and Slurm)"));
    }
    if (!ValidName(node.name)) {
      return absl::InvalidArgumentError(absl::StrCat(topology.path, ":", node.line, ": node '", node.name,
                                                     "' is not a valid Kubernetes name (lowercase letters, digits "
                                                     "and '-', at most 50)"));
    }
  }
  // The topology as the pods see it.
  LAMINA_ASSIGN_OR_RETURN(YAML::Node yaml, RelocatableYaml(topology));
  yaml["model"] = absl::StrCat(kModelsDir, "/", std::filesystem::path(topology.model_dir).filename().string());
  const std::string coordinator = options.prefix + "-coordinator";
  yaml["coordinator"]["host"] = coordinator;
  bool has_secrets = false;
  auto secret = [&](const std::string& file) {
    has_secrets = true;
    return absl::StrCat(kSecretsDir, "/", std::filesystem::path(file).filename().string());
  };
  if (!topology.api_key_file.empty()) yaml["coordinator"]["api_key_file"] = secret(topology.api_key_file);
  if (!topology.cluster_secret_file.empty()) yaml["cluster_secret_file"] = secret(topology.cluster_secret_file);
  if (topology.coordinator_tls.enabled()) {
    yaml["coordinator"]["tls"]["cert"] = secret(topology.coordinator_tls.cert_file);
    yaml["coordinator"]["tls"]["key"] = secret(topology.coordinator_tls.key_file);
    if (!topology.coordinator_tls.ca_file.empty()) yaml["coordinator"]["tls"]["ca"] = secret(topology.coordinator_tls.ca_file);
  }
  std::vector<Process> processes;
  Process head{coordinator, "lamina-coordinator", {"--topology", absl::StrCat(kConfigDir, "/topology.yaml")},
               {{"grpc", topology.coordinator_port}}};
  if (topology.coordinator_http_port != 0) head.ports.push_back({"http", topology.coordinator_http_port});
  processes.push_back(head);
  for (size_t i = 0; i < topology.nodes.size(); ++i) {
    const NodeSpec& node = topology.nodes[i];
    Process p{options.prefix + "-" + node.name,
              node.kind == NodeKind::kMemory ? "lamina-memory-node" : "lamina-compute-node",
              {"--topology", absl::StrCat(kConfigDir, "/topology.yaml"), "--name", node.name},
              {{"grpc", node.port}}};
    if (node.data_port != 0) p.ports.push_back({"data", node.data_port});
    p.gpu = node.device != "cpu";
    yaml["nodes"][i]["host"] = p.name;
    if (p.gpu) yaml["nodes"][i]["device"] = "cuda:0";
    processes.push_back(p);
  }

  // The topology as a literal block, readable in the manifest.
  YAML::Emitter config_map;
  config_map << YAML::BeginMap << YAML::Key << "apiVersion" << YAML::Value << "v1" << YAML::Key << "kind"
             << YAML::Value << "ConfigMap" << YAML::Key << "metadata" << YAML::Value
             << Metadata(options.prefix + "-topology", options, "topology") << YAML::Key << "data" << YAML::Value
             << YAML::BeginMap << YAML::Key << "topology.yaml" << YAML::Value << YAML::Literal
             << (YAML::Dump(yaml) + "\n") << YAML::EndMap << YAML::EndMap;
  std::string out = absl::StrCat("# Written by lamina k8s from ", topology.path, ". Needs: the image ", options.image,
                                 " (deploy/container/Containerfile), the PersistentVolumeClaim ", options.models_claim,
                                 " holding the model folder", has_secrets ? absl::StrCat(", the Secret ", options.prefix,
                                                                                         "-secrets with the topology's files")
                                                                          : "",
                                 ".\n---\n", config_map.c_str(), "\n");
  for (const Process& p : processes) {
    absl::StrAppend(&out, "---\n", YAML::Dump(Deployment(p, options, has_secrets)), "\n---\n",
                    YAML::Dump(Service(p, options)), "\n");
  }
  return out;
}

}  // namespace lamina::k8s

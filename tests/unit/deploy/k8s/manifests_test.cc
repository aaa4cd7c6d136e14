#include "deploy/k8s/manifests.h"

#include <map>
#include <string>
#include <vector>

#include "common/topology/topology.h"
#include "gtest/gtest.h"
#include "yaml-cpp/yaml.h"

namespace lamina::k8s {
namespace {

std::vector<YAML::Node> Documents(const std::string& text) {
  std::vector<YAML::Node> out;
  for (const YAML::Node& doc : YAML::LoadAll(text)) {
    if (doc.IsMap()) out.push_back(doc);
  }
  return out;
}

std::string Topologies() { return std::string(LAMINA_SOURCE_DIR) + "/deploy/topologies/"; }

const YAML::Node* Find(const std::vector<YAML::Node>& docs, const std::string& kind, const std::string& name) {
  for (const YAML::Node& d : docs) {
    if (d["kind"].as<std::string>() == kind && d["metadata"]["name"].as<std::string>() == name) return &d;
  }
  return nullptr;
}

TEST(ManifestsTest, ACpuClusterIsAConfigMapAndADeploymentAndServicePerProcess) {
  absl::StatusOr<Topology> topology = LoadTopology(Topologies() + "local-cpu.yaml");
  ASSERT_TRUE(topology.ok()) << topology.status();
  ManifestOptions options;
  options.image = "registry.example/lamina:0.1.0";
  options.namespace_name = "inference";
  absl::StatusOr<std::string> text = Manifests(*topology, options);
  ASSERT_TRUE(text.ok()) << text.status();
  const std::vector<YAML::Node> docs = Documents(*text);
  ASSERT_EQ(docs.size(), 1u + 2 * 4) << "a ConfigMap, and a Deployment and a Service for each of 4 processes";

  const YAML::Node* config = Find(docs, "ConfigMap", "lamina-topology");
  ASSERT_NE(config, nullptr);
  const YAML::Node placed = YAML::Load((*config)["data"]["topology.yaml"].as<std::string>());
  EXPECT_EQ(placed["model"].as<std::string>(), "/models/lamina-demo-6m");
  EXPECT_EQ(placed["coordinator"]["host"].as<std::string>(), "lamina-coordinator");
  EXPECT_EQ(placed["nodes"][1]["host"].as<std::string>(), "lamina-memory-0");

  const YAML::Node* coordinator = Find(docs, "Deployment", "lamina-coordinator");
  ASSERT_NE(coordinator, nullptr);
  EXPECT_EQ((*coordinator)["metadata"]["namespace"].as<std::string>(), "inference");
  const YAML::Node container = (*coordinator)["spec"]["template"]["spec"]["containers"][0];
  EXPECT_EQ(container["image"].as<std::string>(), "registry.example/lamina:0.1.0");
  EXPECT_EQ(container["command"][0].as<std::string>(), "lamina-coordinator");
  EXPECT_EQ(container["readinessProbe"]["grpc"]["port"].as<int>(), 50151);
  EXPECT_EQ(container["livenessProbe"]["tcpSocket"]["port"].as<int>(), 50151);
  EXPECT_EQ(container["env"][0]["name"].as<std::string>(), "LAMINA_LISTEN_HOST");
  EXPECT_FALSE(container["resources"].IsDefined()) << "no GPU on the CPU";

  const YAML::Node* memory = Find(docs, "Deployment", "lamina-memory-1");
  ASSERT_NE(memory, nullptr);
  const YAML::Node memory_container = (*memory)["spec"]["template"]["spec"]["containers"][0];
  std::vector<std::string> command;
  for (const YAML::Node& part : memory_container["command"]) command.push_back(part.as<std::string>());
  EXPECT_EQ(command, (std::vector<std::string>{"lamina-memory-node", "--topology", "/etc/lamina/topology.yaml",
                                               "--name", "memory-1"}));
  const YAML::Node* service = Find(docs, "Service", "lamina-memory-1");
  ASSERT_NE(service, nullptr);
  std::map<std::string, int> ports;
  for (const YAML::Node& port : (*service)["spec"]["ports"]) ports[port["name"].as<std::string>()] = port["port"].as<int>();
  EXPECT_EQ(ports, (std::map<std::string, int>{{"grpc", 50181}, {"data", 50182}}));
  const YAML::Node* http = Find(docs, "Service", "lamina-coordinator");
  ASSERT_NE(http, nullptr);
  EXPECT_EQ((*http)["spec"]["ports"][1]["port"].as<int>(), 50150);
}

TEST(ManifestsTest, NodesOnGpusAskForOneEachAndSeeItAsCudaZero) {
  absl::StatusOr<Topology> topology = LoadTopology(Topologies() + "pipelining-rotational2-h200x2.yaml");
  ASSERT_TRUE(topology.ok()) << topology.status();
  absl::StatusOr<std::string> text = Manifests(*topology, {});
  ASSERT_TRUE(text.ok()) << text.status();
  const std::vector<YAML::Node> docs = Documents(*text);
  int gpus = 0;
  for (const YAML::Node& d : docs) {
    if (d["kind"].as<std::string>() != "Deployment") continue;
    const YAML::Node resources = d["spec"]["template"]["spec"]["containers"][0]["resources"];
    if (resources.IsDefined()) gpus += resources["limits"]["nvidia.com/gpu"].as<int>();
  }
  int on_gpus = 0;
  for (const NodeSpec& node : topology->nodes) on_gpus += node.device != "cpu" ? 1 : 0;
  EXPECT_EQ(gpus, on_gpus);
  EXPECT_GT(gpus, 1);
  const YAML::Node* config = Find(docs, "ConfigMap", "lamina-topology");
  ASSERT_NE(config, nullptr);
  const YAML::Node placed = YAML::Load((*config)["data"]["topology.yaml"].as<std::string>());
  for (const YAML::Node& node : placed["nodes"]) {
    if (node["device"].as<std::string>() != "cpu") {
      EXPECT_EQ(node["device"].as<std::string>(), "cuda:0");
    }
  }
}

}  // namespace
}  // namespace lamina::k8s

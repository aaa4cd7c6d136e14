#include "deploy/cost/price_table.h"

#include <filesystem>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status/status_macros.h"
#include "common/yaml/yaml_fields.h"

namespace lamina {
namespace {

absl::StatusOr<DeviceKind> ParseDevice(const YAML::Node& node, const std::string& path, const std::string& name) {
  YamlFields f(node, path, "devices." + name,
               {"description", "memory_gb", "memory_bandwidth_gbs", "bf16_tflops", "link_gbs", "purchase_usd",
                "hourly_usd", "source"});
  LAMINA_RETURN_IF_ERROR(f.CheckShape());
  DeviceKind d;
  d.name = name;
  const std::string empty;
  LAMINA_ASSIGN_OR_RETURN(d.description, f.String("description", &empty));
  LAMINA_ASSIGN_OR_RETURN(d.source, f.String("source", nullptr));
  constexpr double kMax = 1e12;
  LAMINA_ASSIGN_OR_RETURN(d.memory_gb, f.Double("memory_gb", nullptr, 1e-3, kMax));
  LAMINA_ASSIGN_OR_RETURN(d.memory_bandwidth_gbs, f.Double("memory_bandwidth_gbs", nullptr, 1e-3, kMax));
  LAMINA_ASSIGN_OR_RETURN(d.bf16_tflops, f.Double("bf16_tflops", nullptr, 1e-6, kMax));
  LAMINA_ASSIGN_OR_RETURN(d.link_gbs, f.Double("link_gbs", nullptr, 1e-6, kMax));
  LAMINA_ASSIGN_OR_RETURN(d.purchase_usd, f.Double("purchase_usd", nullptr, 0, kMax));
  LAMINA_ASSIGN_OR_RETURN(d.hourly_usd, f.Double("hourly_usd", nullptr, 0, kMax));
  return d;
}

}  // namespace

absl::StatusOr<const DeviceKind*> PriceTable::Find(const std::string& kind) const {
  auto it = devices.find(kind);
  if (it != devices.end()) return &it->second;
  std::vector<std::string> known;
  for (const auto& [name, device] : devices) known.push_back(name);
  return absl::NotFoundError(
      absl::StrCat("device kind '", kind, "' is not in the price table ", path, " (it has: ", absl::StrJoin(known, ", "), ")"));
}

absl::StatusOr<PriceTable> LoadPriceTable(const std::string& path) {
  LAMINA_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
  PriceTable table;
  table.path = path;
  try {
    YamlFields top(root, path, "", {"devices"});
    LAMINA_RETURN_IF_ERROR(top.CheckShape());
    YAML::Node devices = top.Get("devices");
    if (!devices.IsMap() || devices.size() == 0) {
      return top.Error(devices, "devices", "expected a mapping of device kind to its figures, at least one");
    }
    for (const auto& entry : devices) {
      const std::string name = entry.first.as<std::string>();
      LAMINA_ASSIGN_OR_RETURN(DeviceKind device, ParseDevice(entry.second, path, name));
      table.devices[name] = std::move(device);
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", e.mark.line + 1, ": ", e.msg));
  }
  return table;
}

std::string DefaultPriceTablePath() {
  std::error_code error;
  const std::filesystem::path program = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return "";
  // Installed (PREFIX/bin/lamina, PREFIX/share/lamina/...), in a build folder inside the source
  // tree (SOURCE/build/bin/lamina), or in one anywhere else (the source tree it was built from).
  for (const std::filesystem::path& table :
       {program.parent_path() / ".." / "share" / "lamina" / "prices" / "devices.yaml",
        program.parent_path() / ".." / ".." / "deploy" / "prices" / "devices.yaml",
        std::filesystem::path(LAMINA_SOURCE_DIR) / "deploy" / "prices" / "devices.yaml"}) {
    if (std::filesystem::exists(table, error)) return table.lexically_normal().string();
  }
  return "";
}

absl::StatusOr<TopologyCost> PriceTopology(const Topology& topology, const PriceTable& table) {
  std::set<std::tuple<std::string, std::string, std::string>> seen;  // (host, device, kind)
  std::map<std::string, int> devices_of_kind;
  for (size_t i = 0; i < topology.nodes.size(); ++i) {
    const NodeSpec& node = topology.nodes[i];
    if (node.price_kind.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(topology.path, ":", node.line, ": nodes[", i, "] '", node.name,
                                                     "' on ", node.device,
                                                     " has no `kind` naming its device in the price table"));
    }
    absl::StatusOr<const DeviceKind*> kind = table.Find(node.price_kind);
    if (!kind.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(topology.path, ":", node.line, ": nodes[", i, "] '", node.name,
                                                     "': ", kind.status().message()));
    }
    if (seen.insert({node.host, node.device, node.price_kind}).second) ++devices_of_kind[node.price_kind];
  }
  TopologyCost cost;
  for (const auto& [kind, count] : devices_of_kind) {
    const DeviceKind& device = table.devices.at(kind);
    auto override_price = topology.prices.find(kind);
    const double hourly = override_price != topology.prices.end() ? override_price->second : device.hourly_usd;
    cost.lines.push_back({kind, count, hourly});
    cost.hourly_usd += count * hourly;
    cost.purchase_usd += count * device.purchase_usd;
  }
  return cost;
}

}  // namespace lamina

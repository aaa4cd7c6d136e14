// The price table (deploy/prices/devices.yaml): per device kind, its price and what it can do, and
// the hourly cost of a topology. A file error names the file, line and field; a topology node whose
// kind is missing from the table is an error naming the node.
// Immutable after loading; thread-safe to read.
#ifndef LAMINA_DEPLOY_COST_PRICE_TABLE_H_
#define LAMINA_DEPLOY_COST_PRICE_TABLE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/topology/topology.h"

namespace lamina {

struct DeviceKind {
  std::string name;  // the key, e.g. "h100"
  std::string description;
  double memory_gb = 0;             // usable device memory, 1e9 bytes
  double memory_bandwidth_gbs = 0;  // 1e9 bytes/s
  double bf16_tflops = 0;           // dense
  double link_gbs = 0;              // to other devices, one direction, 1e9 bytes/s
  double purchase_usd = 0;
  double hourly_usd = 0;
  std::string source;               // where the figures come from
};

struct PriceTable {
  std::string path;
  std::map<std::string, DeviceKind> devices;

  // NotFound naming the kind and the kinds the table has.
  absl::StatusOr<const DeviceKind*> Find(const std::string& kind) const;
};

absl::StatusOr<PriceTable> LoadPriceTable(const std::string& path);
// The table shipped with the source tree (deploy/prices/devices.yaml, found from the running
// program's folder, build/bin/); empty when it is not there.
std::string DefaultPriceTablePath();

// What a topology costs per hour. Nodes on the same host, device and kind share one device and are
// charged once (a colocated memory node costs nothing extra); the topology's `prices:` override
// the table's hourly prices.
struct TopologyCost {
  struct Line {
    std::string kind;
    int devices = 0;
    double hourly_usd_each = 0;
  };
  std::vector<Line> lines;  // one per kind, in name order
  double hourly_usd = 0;
  double purchase_usd = 0;
};
absl::StatusOr<TopologyCost> PriceTopology(const Topology& topology, const PriceTable& table);

}  // namespace lamina

#endif  // LAMINA_DEPLOY_COST_PRICE_TABLE_H_

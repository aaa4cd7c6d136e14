#include "deploy/cost/price_table.h"

#include "common/topology/topology.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace lamina {
namespace {

constexpr char kTable[] = R"(devices:
  big:
    memory_gb: 80
    memory_bandwidth_gbs: 3000
    bf16_tflops: 900
    link_gbs: 50
    purchase_usd: 30000
    hourly_usd: 3.0
    source: test
  small:
    memory_gb: 24
    memory_bandwidth_gbs: 1000
    bf16_tflops: 100
    link_gbs: 10
    purchase_usd: 2000
    hourly_usd: 0.5
    source: test
)";

std::string TopologyText(const std::string& memory_host_1, const std::string& extra) {
  return "model: " LAMINA_SOURCE_DIR "/deploy/models/lamina-demo-6m" R"(
coordinator: {port: 1}
nodes:
  - {name: c, role: compute, port: 2, kind: big}
  - {name: m0, role: memory, port: 3, data_port: 4, kv_capacity_tokens: 10, kind: small}
  - {name: m1, role: memory, host: )" + memory_host_1 + R"(, port: 5, data_port: 6, kv_capacity_tokens: 10, kind: small}
)" + extra;
}

TEST(PriceTableTest, LoadsEveryField) {
  testing::TempDir dir;
  absl::StatusOr<PriceTable> table = LoadPriceTable(dir.Write("p.yaml", kTable));
  ASSERT_TRUE(table.ok()) << table.status();
  const DeviceKind& big = table->devices.at("big");
  EXPECT_EQ(big.memory_gb, 80);
  EXPECT_EQ(big.memory_bandwidth_gbs, 3000);
  EXPECT_EQ(big.bf16_tflops, 900);
  EXPECT_EQ(big.hourly_usd, 3.0);
  EXPECT_FALSE(table->Find("huge").ok());
}

TEST(PriceTableTest, ErrorsNameFileLineAndField) {
  testing::TempDir dir;
  const std::string path = dir.Write("bad.yaml", "devices:\n  x:\n    source: test\n    memory_gb: lots\n");
  absl::Status status = LoadPriceTable(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("bad.yaml:4: devices.x.memory_gb"), std::string::npos) << status;
}

TEST(PriceTableTest, ShippedTableLoads) {
  absl::StatusOr<PriceTable> table = LoadPriceTable(LAMINA_SOURCE_DIR "/deploy/prices/devices.yaml");
  ASSERT_TRUE(table.ok()) << table.status();
  for (const char* kind : {"h100", "h200", "h20", "cpu", "cpu-memory"}) EXPECT_TRUE(table->Find(kind).ok()) << kind;
}

TEST(PriceTableTest, NodesOnOneDeviceAreChargedOnce) {
  testing::TempDir dir;
  absl::StatusOr<PriceTable> table = LoadPriceTable(dir.Write("p.yaml", kTable));
  ASSERT_TRUE(table.ok());
  // Both memory nodes on one host and device: one small device.
  absl::StatusOr<Topology> shared = ParseTopology(TopologyText("127.0.0.1", ""), "t.yaml");
  ASSERT_TRUE(shared.ok()) << shared.status();
  absl::StatusOr<TopologyCost> cost = PriceTopology(*shared, *table);
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_DOUBLE_EQ(cost->hourly_usd, 3.0 + 0.5);
  // On their own hosts: two; the topology's prices override the table's.
  absl::StatusOr<Topology> apart = ParseTopology(TopologyText("127.0.0.2", "prices: {small: 0.25}\n"), "t.yaml");
  ASSERT_TRUE(apart.ok()) << apart.status();
  cost = PriceTopology(*apart, *table);
  ASSERT_TRUE(cost.ok());
  EXPECT_DOUBLE_EQ(cost->hourly_usd, 3.0 + 2 * 0.25);
  EXPECT_DOUBLE_EQ(cost->purchase_usd, 30000 + 2 * 2000);
  ASSERT_EQ(cost->lines.size(), 2u);
  EXPECT_EQ(cost->lines[1].kind, "small");
  EXPECT_EQ(cost->lines[1].devices, 2);
}

TEST(PriceTableTest, UnknownKindNamesTheNode) {
  testing::TempDir dir;
  absl::StatusOr<PriceTable> table = LoadPriceTable(dir.Write("p.yaml", kTable));
  ASSERT_TRUE(table.ok());
  std::string text = TopologyText("127.0.0.1", "");
  text.replace(text.find("kind: big"), 9, "kind: tpu");
  absl::StatusOr<Topology> topology = ParseTopology(text, "t.yaml");
  ASSERT_TRUE(topology.ok());
  absl::Status status = PriceTopology(*topology, *table).status();
  EXPECT_NE(status.message().find("'c'"), std::string::npos) << status;
  EXPECT_NE(status.message().find("'tpu'"), std::string::npos) << status;
}

}  // namespace
}  // namespace lamina

// lamina-coordinator: serves the client API (lamina.v1.Generation) and cluster membership
// (lamina.v1.Cluster) on the topology's coordinator port, OpenAI's HTTP API on its http_port when
// it has one, and drives the nodes. On SIGINT or SIGTERM it drains: admits nothing more, lets the
// requests in flight finish for up to scheduler.shutdown_grace_s, then stops (requests still
// running end with UNAVAILABLE). With `coordinator.tls` both APIs speak TLS only.
//
//   lamina-coordinator --topology FILE
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/chat_template/chat_template.h"
#include "common/flags/flags.h"
#include "common/http/http_server.h"
#include "common/net/sockets.h"
#include "common/rpc/daemon.h"
#include "common/rpc/signals.h"
#include "common/rpc/tls_credentials.h"
#include "common/security/api_keys.h"
#include "common/security/cluster_secret.h"
#include "common/status/status_macros.h"
#include "common/tokenizer/model_tokenizer.h"
#include "common/topology/topology.h"
#include "coordinator/api/cluster_service.h"
#include "coordinator/api/generation_service.h"
#include "coordinator/openai/openai_api.h"
#include "grpcpp/grpcpp.h"

namespace lamina {
namespace {

constexpr char kUsage[] =
    "usage: lamina-coordinator --topology FILE\n"
    "  Serves a cluster's gRPC API (and OpenAI's HTTP API at coordinator.http_port), admits and\n"
    "  schedules requests, and drives the topology's nodes. `lamina up FILE` starts it with them.\n";

absl::Status Run(const std::vector<std::string>& args) {
  LAMINA_ASSIGN_OR_RETURN(cli::Flags flags, cli::Flags::Parse(args, {"topology"}, {}));
  LAMINA_ASSIGN_OR_RETURN(Topology topology, LoadTopology(flags.String("topology", "")));
  LAMINA_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(topology.model_dir));
  LAMINA_RETURN_IF_ERROR(CheckLayerSplit(topology, config.num_layers));
  LAMINA_ASSIGN_OR_RETURN(Tokenizer tokenizer, LoadModelTokenizer(topology.model_dir, config));
  const std::string model_name = std::filesystem::path(topology.model_dir).filename().string();
  LAMINA_ASSIGN_OR_RETURN(const std::optional<ClusterSecret> secret, ClusterSecret::Load(topology.cluster_secret_file));
  LAMINA_ASSIGN_OR_RETURN(ApiKeys keys, ApiKeys::Load(topology.api_key_file));

  Scheduler* scheduler_for_deaths = nullptr;
  Membership membership(topology, [&](const std::string& node, const std::string& why) {
    std::fprintf(stderr, "coordinator: node %s declared dead: %s\n", node.c_str(), why.c_str());
    if (scheduler_for_deaths) scheduler_for_deaths->OnNodeDeath(node);
  });
  Scheduler scheduler(topology, config, &tokenizer, &membership, nullptr, secret);
  scheduler_for_deaths = &scheduler;
  absl::StatusOr<ChatTemplate> chat_template = ChatTemplate::Load(topology.model_dir);
  if (!chat_template.ok() && !absl::IsNotFound(chat_template.status())) {
    std::fprintf(stderr, "coordinator: chat requests will fail: %s\n",
                 std::string(chat_template.status().message()).c_str());
  }
  GenerationService generation(model_name, config, &tokenizer, chat_template, &scheduler, &membership, keys,
                               topology.open_probes);
  ClusterService cluster(model_name, topology.heartbeat_interval_ms, &membership, &scheduler, secret, keys);

  LAMINA_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                          GrpcServerCredentials(topology.coordinator_tls));
  LAMINA_ASSIGN_OR_RETURN(std::unique_ptr<grpc::Server> server,
                          StartGrpcServer(ListenAddress(topology.coordinator_address()), {&generation, &cluster}, credentials));
  const bool tls = topology.coordinator_tls.enabled();
  std::fprintf(stderr, "coordinator: serving %s on %s (%s; %s; %s)\n", model_name.c_str(),
               topology.coordinator_address().c_str(), tls ? "TLS" : "no TLS",
               keys.enabled() ? absl::StrCat(keys.size(), " API key", keys.size() == 1 ? "" : "s").c_str()
                              : "no API keys: open to anyone who can reach it",
               secret ? "nodes prove the cluster secret" : "no cluster secret: nodes are not authenticated");
  OpenAiApi openai(model_name, config, &tokenizer, std::move(chat_template), &scheduler, &membership, keys,
                   topology.open_probes);
  std::unique_ptr<HttpServer> http;
  if (topology.coordinator_http_port != 0) {
    HttpServerOptions options;
    if (tls) {
      LAMINA_ASSIGN_OR_RETURN(options.tls,
                              TlsContext::ForServer(topology.coordinator_tls.cert_file, topology.coordinator_tls.key_file));
    }
    LAMINA_ASSIGN_OR_RETURN(http, HttpServer::Start(
                                      ListenAddress(topology.coordinator_http_address()),
                                      [&openai](const HttpRequest& request, HttpResponder& responder) {
                                        openai.Handle(request, responder);
                                      },
                                      options));
    std::fprintf(stderr, "coordinator: OpenAI-compatible HTTP API on %s://%s/v1\n", tls ? "https" : "http",
                 http->address().c_str());
  }
  // grpc.health.v1.Health follows the cluster: SERVING while it can serve (a node may be down),
  // NOT_SERVING without a live compute node and once draining.
  membership.SetServingListener([&server](bool can_serve) { SetServing(server.get(), can_serve); });
  WaitForTerminationSignal();
  membership.SetServingListener(nullptr);
  SetServing(server.get(), false);
  std::fprintf(stderr, "coordinator: draining: no new requests; waiting up to %d s for those in flight\n",
               topology.shutdown_grace_s);
  const bool drained = scheduler.Drain(absl::Seconds(topology.shutdown_grace_s));
  std::fprintf(stderr, "coordinator: %s\n",
               drained ? "every request in flight finished; stopping" : "the grace period is over; stopping");
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  http.reset();       // hangs up open HTTP requests, which cancels them
  membership.Stop();  // no death callback may reach the scheduler while it is destroyed
  return absl::OkStatus();
}

}  // namespace
}  // namespace lamina

int main(int argc, char** argv) {
  return lamina::DaemonMain("lamina-coordinator", lamina::kUsage, argc, argv, lamina::Run);
}

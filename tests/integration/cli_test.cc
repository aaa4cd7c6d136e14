// Runs the real `lamina` binary as a user would.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/security/tls_context.h"
#include "coordinator/embedded/local_cluster.h"
#include "gtest/gtest.h"
#include "tests/support/golden.h"
#include "tests/support/temp_dir.h"

namespace lamina {
namespace {

using ::lamina::testing::GoldenTensors;
using ::lamina::testing::LoadGoldenJson;
using ::lamina::testing::ModelDir;

struct Result {
  int exit_code;
  std::string out;  // stdout, or stdout and stderr with `merge_stderr`
};

Result RunLamina(const std::string& args, const std::string& stdin_file = "", bool merge_stderr = false) {
  std::string command = std::string(LAMINA_BINARY) + " " + args;
  if (!stdin_file.empty()) command += " < " + stdin_file;
  command += merge_stderr ? " 2>&1" : " 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  Result result{-1, ""};
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.out.append(buffer, n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string Quote(const std::string& s) { return "'" + s + "'"; }

TEST(CliTest, EveryCommandAndDaemonTakesHelpAndVersion) {
  for (const char* command :
       {"serve", "up", "place", "k8s", "generate", "status", "bench", "experiment", "plan", "simulate", "cert"}) {
    Result help = RunLamina(std::string(command) + " --help", "", true);
    EXPECT_EQ(help.exit_code, 0) << command << ": " << help.out;
    EXPECT_EQ(help.out.rfind(std::string("usage: lamina ") + command, 0), 0u) << command << ": " << help.out;
    EXPECT_EQ(RunLamina(std::string("help ") + command).out, help.out) << command;
  }
  Result version = RunLamina("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.out.rfind("lamina ", 0), 0u) << version.out;
  EXPECT_EQ(RunLamina("version").out, version.out);
  const std::string bin = std::string(LAMINA_BINARY).substr(0, std::string(LAMINA_BINARY).rfind('/'));
  for (const char* daemon : {"lamina-coordinator", "lamina-compute-node", "lamina-memory-node"}) {
    FILE* pipe = popen((bin + "/" + daemon + " --help 2>&1").c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string out;
    char buffer[4096];
    size_t n;
    while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
    const int status = pclose(pipe);
    EXPECT_EQ(WEXITSTATUS(status), 0) << daemon;
    EXPECT_EQ(out.rfind(std::string("usage: ") + daemon + " --topology FILE", 0), 0u) << daemon << ": " << out;
  }
}

TEST(CliTest, AnInstalledLaminaFindsItsDataAndServesTheBundledModel) {
  testing::TempDir prefix;
  const std::string install = "cmake --install " + std::string(LAMINA_BUILD_DIR) + " --prefix " + prefix.path() +
                              " >/dev/null 2>&1";
  ASSERT_EQ(std::system(install.c_str()), 0) << install;
  const std::string bin = prefix.path() + "/bin/lamina", share = prefix.path() + "/share/lamina";
  for (const char* program : {"lamina-coordinator", "lamina-compute-node", "lamina-memory-node"}) {
    EXPECT_EQ(::access((prefix.path() + "/bin/" + program).c_str(), X_OK), 0) << program;
  }
  // From another folder: the price table is found under share/lamina, not the source tree.
  const std::string workload = prefix.Write("w.yaml", "mode: closed\nconcurrency: 64\nrequests: 256\n");
  const std::string plan = "cd / && " + bin + " plan --model " + share + "/models/llama-3.1-8b-shape --workload " +
                           workload + " --compute h100 --top 3 2>&1";
  FILE* pipe = popen(plan.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  EXPECT_EQ(WEXITSTATUS(pclose(pipe)), 0) << out;
  EXPECT_NE(out.find("h100"), std::string::npos) << out;

  nlohmann::json golden = LoadGoldenJson("lamina-demo-6m");
  pipe = popen((bin + " generate --model " + share + "/models/lamina-demo-6m --prompt 'In this paper, we' " +
                "--max-tokens 48 2>/dev/null").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  out.clear();
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  pclose(pipe);
  EXPECT_EQ(out, golden["prompts"][3]["greedy_text"].get<std::string>() + "\n");
  EXPECT_EQ(::access((share + "/slurm/lamina.sbatch").c_str(), X_OK), 0);
  EXPECT_EQ(::access((share + "/topologies/local-cpu.yaml").c_str(), R_OK), 0);
}

TEST(CliTest, NoClusterToReachSaysWhatToDo) {
  Result r = RunLamina("status --endpoint 127.0.0.1:1", "", true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("no cluster answers at 127.0.0.1:1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lamina up"), std::string::npos) << r.out;
}

TEST(CliTest, CertWritesACertificateAServerAndItsClientsCanUse) {
  testing::TempDir dir;
  Result made = RunLamina("cert --host 127.0.0.1 --host coordinator.example --out " + dir.path() + "/tls", "", true);
  ASSERT_EQ(made.exit_code, 0) << made.out;
  const std::string cert = dir.path() + "/tls/coordinator.pem", key = dir.path() + "/tls/coordinator.key";
  EXPECT_NE(made.out.find("--tls-ca " + cert), std::string::npos) << made.out;
  EXPECT_TRUE(TlsContext::ForServer(cert, key).ok());
  EXPECT_TRUE(TlsContext::ForClient(cert).ok());
  Result again = RunLamina("cert --host 127.0.0.1 --out " + dir.path() + "/tls", "", true);
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.out.find("coordinator.pem exists"), std::string::npos) << again.out;
  Result no_host = RunLamina("cert --out " + dir.path(), "", true);
  EXPECT_EQ(no_host.exit_code, 2);
  EXPECT_NE(no_host.out.find("--host is required"), std::string::npos) << no_host.out;
}

TEST(CliTest, DemoModelPrintsTheGoldenText) {
  nlohmann::json golden = LoadGoldenJson("lamina-demo-6m");
  const auto& prompt = golden["prompts"][3];
  ASSERT_EQ(prompt["text"], "In this paper, we");
  Result r = RunLamina("generate --model " + ModelDir("lamina-demo-6m") +
                       " --prompt 'In this paper, we' --max-tokens 48 --temperature 0");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, prompt["greedy_text"].get<std::string>() + "\n");
}

// A float8 KV cache rounds each k/v to 3 significant bits, yet the demo model's greedy text stays
// the golden one (DemoModelGoldenTest checks each step's logits). A GPU's cache has no float32.
TEST(CliTest, AFloat8KvCacheKeepsTheGoldenText) {
  nlohmann::json golden = LoadGoldenJson("lamina-demo-6m");
  const auto& prompt = golden["prompts"][2];
  const std::string command = "generate --model " + ModelDir("lamina-demo-6m") + " --prompt " +
                              Quote(prompt["text"].get<std::string>()) + " --max-tokens 48 --kv-dtype ";
  Result r = RunLamina(command + "float8_e4m3");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, prompt["greedy_text"].get<std::string>() + "\n");

  Result misspelt = RunLamina(command + "fp8", "", true);
  EXPECT_EQ(misspelt.exit_code, 2);
  EXPECT_NE(misspelt.out.find("--kv-dtype: expected auto, float32, bfloat16 or float8_e4m3, got 'fp8'"),
            std::string::npos)
      << misspelt.out;
  Result gpu = RunLamina(command + "float32 --device cuda:0", "", true);
  EXPECT_EQ(gpu.exit_code, 2);
  EXPECT_NE(gpu.out.find("--kv-dtype: float32 is for the CPU; a GPU's KV pool is bfloat16 or float8_e4m3"),
            std::string::npos)
      << gpu.out;
}

// --stop works without a cluster too, and prints what the cluster's API gives
// (ClusterTest.StopStringsEndGenerationBeforeTheStopText): the text before the stop string.
TEST(CliTest, StopStringsEndTheCompletionBeforeThem) {
  Result r = RunLamina("generate --model " + ModelDir("lamina-demo-6m") +
                       " --prompt 'In this paper, we' --max-tokens 48 --stop efficiency --stop 'no such text'");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, " introduce attention offloading, an innovative architectural approach to improve the cost \n");
}

TEST(CliTest, SeveralPromptsRunAsOneBatchAndPrintInOrder) {
  nlohmann::json golden = LoadGoldenJson("lamina-demo-6m");
  std::string args = "generate --model " + ModelDir("lamina-demo-6m") + " --max-tokens 48";
  std::string expected;
  for (const auto& p : golden["prompts"]) {
    args += " --prompt " + Quote(p["text"]);
    expected += p["greedy_text"].get<std::string>() + "\n";
  }
  Result r = RunLamina(args);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, expected);
}

TEST(CliTest, PromptIdsAndPrintIdsGiveTheGoldenIds) {
  GoldenTensors golden("tiny-llama3");
  std::string args = "generate --model " + ModelDir("tiny-llama3") + " --max-tokens 24 --ignore-eos --print-ids";
  std::string expected;
  for (int p = 0; p < 3; ++p) {
    const std::string key = "prompt_" + std::to_string(p);
    args += " --prompt-ids " + absl::StrJoin(golden.Ids(key + ".ids"), ",");
    expected += absl::StrJoin(golden.Ids(key + ".greedy_ids"), " ") + "\n";
  }
  Result r = RunLamina(args);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, expected);
}

// --logprobs N: after the completion, a line per token with its id and log probability and the N
// most likely tokens, the first of which is the token itself when decoding greedily.
TEST(CliTest, LogprobsFollowTheCompletionALineAToken) {
  GoldenTensors golden("tiny-llama3");
  const std::vector<int32_t> greedy = golden.Ids("prompt_0.greedy_ids");
  Result r = RunLamina("generate --model " + ModelDir("tiny-llama3") + " --max-tokens 5 --ignore-eos --print-ids " +
                       "--logprobs 2 --prompt-ids " + absl::StrJoin(golden.Ids("prompt_0.ids"), ","));
  ASSERT_EQ(r.exit_code, 0);
  const std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 6u) << r.out;
  EXPECT_EQ(lines[0], absl::StrJoin(greedy.begin(), greedy.begin() + 5, " "));
  for (int t = 0; t < 5; ++t) {
    const std::string& line = lines[t + 1];
    // "    -0.0123  " the" (279)  top: " the" -0.0123 | " a" -4.5200"
    const size_t id_at = line.find(" (" + std::to_string(greedy[t]) + ")  top: ");
    ASSERT_NE(id_at, std::string::npos) << line;
    const std::string logprob = std::string(absl::StripAsciiWhitespace(line.substr(0, line.find("  \""))));
    const std::string token = line.substr(line.find('"'), id_at - line.find('"'));
    const std::vector<std::string> top = absl::StrSplit(line.substr(line.find("top: ") + 5), " | ");
    ASSERT_EQ(top.size(), 2u) << line;
    EXPECT_EQ(top[0], token + " " + logprob) << line;
    EXPECT_LE(std::stod(logprob), 0.0) << line;
  }
  EXPECT_EQ(RunLamina("generate --model " + ModelDir("tiny-llama3") + " --prompt x --logprobs 21").exit_code, 2);
}

// The penalty flags reach the sampler: the ids are single-process mode's with the same penalties,
// and not the greedy ones.
TEST(CliTest, PenaltyFlagsGiveThePenalizedTokens) {
  auto local = LocalCluster::Load(ModelDir("lamina-demo-6m"));
  ASSERT_TRUE(local.ok()) << local.status();
  GenerationRequest request;
  request.prompt = (*local)->tokenizer().EncodePrompt("We are the");
  request.max_tokens = 40;
  request.ignore_eos = true;
  request.sampling.repetition_penalty = 2.0f;
  request.sampling.presence_penalty = 1.5f;
  request.sampling.frequency_penalty = 1.0f;
  std::vector<int32_t> want;
  ASSERT_TRUE((*local)->Generate({&request, 1}, [&](const TokenEvent& e) { want.push_back(e.token); }).ok());
  const std::string command = "generate --model " + ModelDir("lamina-demo-6m") +
                              " --max-tokens 40 --ignore-eos --print-ids --prompt-ids " +
                              absl::StrJoin(request.prompt, ",");
  Result penalized = RunLamina(command + " --repetition-penalty 2 --presence-penalty 1.5 --frequency-penalty 1");
  ASSERT_EQ(penalized.exit_code, 0) << penalized.out;
  EXPECT_EQ(penalized.out, absl::StrJoin(want, " ") + "\n");
  Result greedy = RunLamina(command);
  ASSERT_EQ(greedy.exit_code, 0) << greedy.out;
  EXPECT_NE(greedy.out, penalized.out);

  Result bad = RunLamina(command + " --presence-penalty 3", "", /*merge_stderr=*/true);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.out.find("--presence-penalty must be from -2 to 2, got 3"), std::string::npos) << bad.out;
}

TEST(CliTest, ReadsPromptsFromStandardInputOneALine) {
  nlohmann::json golden = LoadGoldenJson("lamina-demo-6m");
  testing::TempDir dir;
  std::string input = golden["prompts"][0]["text"].get<std::string>() + "\n" +
                      golden["prompts"][1]["text"].get<std::string>() + "\n";
  std::string path = dir.Write("prompts.txt", input);
  Result r = RunLamina("generate --model " + ModelDir("lamina-demo-6m") + " --max-tokens 48", path);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, golden["prompts"][0]["greedy_text"].get<std::string>() + "\n" +
                       golden["prompts"][1]["greedy_text"].get<std::string>() + "\n");
}

// The batch `lamina plan` gives the design named `design` ("1 x h100 (colocated)"); -1 if unlisted.
int64_t PlannedBatch(const std::string& plan, const std::string& design) {
  for (absl::string_view line : absl::StrSplit(plan, '\n')) {
    const size_t at = line.find(design);
    if (at == absl::string_view::npos) continue;
    std::vector<std::string> rest = absl::StrSplit(line.substr(at + design.size()), ' ', absl::SkipEmpty());
    int64_t batch = -1;
    return !rest.empty() && absl::SimpleAtoi(rest[0], &batch) ? batch : -1;
  }
  return -1;
}

TEST(CliTest, PlanSizesTheKvCacheInTheDtypeAsked) {
  testing::TempDir dir;
  const std::string workload =
      dir.Write("w.yaml", "mode: closed\nconcurrency: 64\nrequests: 256\nprompt_tokens: 1024\noutput_tokens: 256\n");
  const std::string command = "plan --model " + std::string(LAMINA_SOURCE_DIR) +
                              "/deploy/models/llama-3.1-8b-shape --workload " + workload + " --compute h100 --top 20";
  Result bf16 = RunLamina(command);
  Result f8 = RunLamina(command + " --kv-dtype float8_e4m3");
  ASSERT_EQ(bf16.exit_code, 0);
  ASSERT_EQ(f8.exit_code, 0);
  // Llama-3-8B: k and v of 8 heads x 128 over 32 layers; float8 adds a float scale per head.
  EXPECT_NE(bf16.out.find("131.1 KB of KV per token in bfloat16"), std::string::npos) << bf16.out;
  EXPECT_NE(f8.out.find("67.6 KB of KV per token in float8_e4m3"), std::string::npos) << f8.out;
  const int64_t bf16_batch = PlannedBatch(bf16.out, "1 x h100 (colocated)");
  const int64_t f8_batch = PlannedBatch(f8.out, "1 x h100 (colocated)");
  ASSERT_GT(bf16_batch, 0) << bf16.out;
  EXPECT_GE(f8_batch, bf16_batch * 19 / 10) << f8.out;  // 131.1 / 67.6 = 1.94 times the tokens
  Result bad = RunLamina(command + " --kv-dtype fp8", "", /*merge_stderr=*/true);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.out.find("--kv-dtype: expected 'bfloat16' or 'float8_e4m3', got 'fp8'"), std::string::npos) << bad.out;
}

TEST(CliTest, NSamplesPrintInTurnAndEachEqualsARunWithItsSeed) {
  const std::string base = "generate --model " + ModelDir("lamina-demo-6m") + " --prompt We --temperature 1.2 --max-tokens 16";
  Result n3 = RunLamina(base + " --n 3 --seed 5");
  ASSERT_EQ(n3.exit_code, 0);
  std::string separate;
  for (int seed : {5, 6, 7}) separate += RunLamina(base + " --seed " + std::to_string(seed)).out;
  EXPECT_EQ(n3.out, separate);
  EXPECT_EQ(std::count(n3.out.begin(), n3.out.end(), '\n'), 3);
}

// A completion that the model's context cuts short of --max-tokens is named on stderr, after the
// tokens that fit; one that ends as asked is not.
TEST(CliTest, ACompletionThatTheContextCutShortIsNamed) {
  const std::string long_prompt = absl::StrJoin(std::vector<std::string>(1000, "40"), ",");
  Result r = RunLamina("generate --model " + ModelDir("lamina-demo-6m") + " --prompt-ids 7,8 --prompt-ids " +
                           long_prompt + " --max-tokens 100 --ignore-eos --print-ids --n 2 --temperature 1",
                       "", true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 6u) << r.out;
  for (int i : {0, 1}) EXPECT_EQ(std::vector<std::string>(absl::StrSplit(lines[i], ' ')).size(), 100u);
  for (int i : {2, 3})
    EXPECT_EQ(std::vector<std::string>(absl::StrSplit(lines[i], ' ')).size(),
              25u);  // 1024 - 1000, and the last one drawn
  EXPECT_EQ(lines[4],
            "lamina generate: prompt 2, sample 1, stopped before --max-tokens: the model's context of 1024 "
            "tokens is full");
  EXPECT_EQ(lines[5],
            "lamina generate: prompt 2, sample 2, stopped before --max-tokens: the model's context of 1024 "
            "tokens is full");
}

// --chat puts each prompt, after --system, into the model's chat template: the same ids as the
// rendered conversation given with --prompt-ids.
TEST(CliTest, ChatPromptsGoThroughTheModelsTemplate) {
  testing::TempDir model;
  model.CopyFrom(ModelDir("lamina-demo-6m"));
  nlohmann::json config = nlohmann::json::parse(testing::ReadFileOrDie(model.path() + "/tokenizer_config.json"));
  config["chat_template"] =
      "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
      "{{ m.content | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
      "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";
  model.Write("tokenizer_config.json", config.dump());
  auto local = LocalCluster::Load(model.path());
  ASSERT_TRUE(local.ok()) << local.status();
  const std::string text =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWhat is a memory node?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n";
  const std::vector<int32_t> ids = (*local)->tokenizer().Encode(text);
  Result by_ids = RunLamina("generate --model " + model.path() + " --prompt-ids " + absl::StrJoin(ids, ",") +
                            " --max-tokens 12 --ignore-eos --print-ids");
  ASSERT_EQ(by_ids.exit_code, 0);
  Result chat = RunLamina("generate --model " + model.path() +
                          " --chat --system 'Be brief.' --prompt 'What is a memory node?' --max-tokens 12 "
                          "--ignore-eos --print-ids");
  EXPECT_EQ(chat.exit_code, 0);
  EXPECT_EQ(chat.out, by_ids.out);
  EXPECT_EQ(std::count(by_ids.out.begin(), by_ids.out.end(), ' '), 11);

  Result none = RunLamina("generate --model " + ModelDir("lamina-demo-6m") + " --chat --prompt hi", "", true);
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.out.find("has no chat template"), std::string::npos) << none.out;
  Result system_alone = RunLamina("generate --model " + model.path() + " --system x --prompt hi", "", true);
  EXPECT_EQ(system_alone.exit_code, 2);
  EXPECT_NE(system_alone.out.find("--system needs --chat"), std::string::npos) << system_alone.out;
}

TEST(CliTest, ErrorsAreClearAndExitNonZero) {
  Result missing = RunLamina("generate --model /nonexistent/model --prompt hi", "", true);
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.out.find("/nonexistent/model/config.json: cannot open"), std::string::npos) << missing.out;

  Result bad_flag = RunLamina("generate --model x --promt hi", "", true);
  EXPECT_EQ(bad_flag.exit_code, 2);
  EXPECT_NE(bad_flag.out.find("unknown flag --promt"), std::string::npos) << bad_flag.out;

  Result bad_ids = RunLamina("generate --model " + ModelDir("tiny-llama3") + " --prompt-ids 1,x,3", "", true);
  EXPECT_EQ(bad_ids.exit_code, 2);
  EXPECT_NE(bad_ids.out.find("'x' is not a token id"), std::string::npos) << bad_ids.out;

  std::vector<std::string> ids(1100, "40");
  Result too_long = RunLamina("generate --model " + ModelDir("tiny-llama3") + " --prompt-ids " +
                                  absl::StrJoin(ids, ","), "", true);
  EXPECT_EQ(too_long.exit_code, 1);
  EXPECT_NE(too_long.out.find("the prompt has 1100 tokens; the model's context is 1024"), std::string::npos)
      << too_long.out;

  Result unknown = RunLamina("srve", "", true);
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.out.find("unknown command 'srve'"), std::string::npos);
}

}  // namespace
}  // namespace lamina

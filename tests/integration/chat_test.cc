// Chats through a real cluster: the coordinator puts a conversation into the model's chat
// template, and a conversation the template refuses fails alone.
#include <string>
#include <vector>

#include "common/chat_template/chat_prompt.h"
#include "coordinator/embedded/local_cluster.h"
#include "gtest/gtest.h"
#include "tests/integration/chat_model.h"
#include "tests/integration/cluster_harness.h"
#include "tests/integration/requests_in_flight.h"
#include "tests/integration/single_process.h"
#include "tests/support/golden.h"
#include "tests/support/temp_dir.h"

namespace lamina::testing {
namespace {

lamina::v1::GenerateRequest ChatRequest(const std::vector<ChatMessage>& messages, int max_tokens) {
  lamina::v1::GenerateRequest r;
  r.mutable_chat();  // set, even with no messages
  for (const ChatMessage& m : messages) {
    lamina::v1::ChatMessage* message = r.mutable_chat()->add_messages();
    message->set_role(m.role);
    message->set_content(m.content);
  }
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  return r;
}

TEST(ChatClusterTest, ChatsFollowTheModelsTemplateAndARefusedOneFailsAlone) {
  TempDir model;
  WriteChatModel(model);
  ClusterOptions options;
  options.model = model.path();
  auto cluster = ClusterHarness::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<lamina::v1::ListModelsResponse> models = (*cluster)->client().ListModels(absl::Seconds(10));
  ASSERT_TRUE(models.ok()) << models.status();
  ASSERT_EQ(models->models_size(), 1);
  EXPECT_TRUE(models->models(0).chat_template());

  auto local = LocalCluster::Load(model.path());
  ASSERT_TRUE(local.ok()) << local.status();
  const absl::StatusOr<ChatTemplate> chat_template = ChatTemplate::Load(model.path());
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  const std::vector<std::vector<ChatMessage>> chats = {
      {{"user", "What is attention offloading?"}},
      {{"system", "Answer in one line."}, {"user", "Why split the model at attention?"}},
      {{"user", "Hi"}, {"assistant", "Hello."}, {"user", "What does a memory node hold?"}},
  };
  std::vector<lamina::v1::GenerateRequest> requests;
  std::vector<std::vector<int32_t>> expected;
  for (size_t i = 0; i < chats.size(); ++i) {
    absl::StatusOr<std::vector<int32_t>> prompt = EncodeChat(*chat_template, (*local)->tokenizer(), chats[i]);
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    // One BOS, from the template: the cluster must not add another.
    EXPECT_EQ((*prompt)[0], *(*local)->tokenizer().bos_id());
    EXPECT_EQ(std::count(prompt->begin(), prompt->end(), (*prompt)[0]), 1);
    const int max_tokens = 10 + 6 * static_cast<int>(i);
    requests.push_back(ChatRequest(chats[i], max_tokens));
    expected.push_back(SingleProcessIds(**local, *prompt, max_tokens));
  }
  requests.push_back(ChatRequest({{"user", "a"}, {"user", "b"}}, 8));  // refused by the template
  requests.push_back(ChatRequest({}, 8));                              // no messages

  const std::vector<Outcome> outcomes = GenerateConcurrently((*cluster)->client(), requests);
  for (size_t i = 0; i < chats.size(); ++i) {
    ASSERT_TRUE(outcomes[i].status.ok()) << "chat " << i << ": " << outcomes[i].status;
    EXPECT_EQ(outcomes[i].ids, expected[i]) << "chat " << i;
  }
  EXPECT_EQ(outcomes[3].status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(outcomes[3].status.message().find("refused the conversation: line 1: Conversation roles must alternate"),
            absl::string_view::npos)
      << outcomes[3].status;
  EXPECT_EQ(outcomes[4].status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(outcomes[4].status.message().find("at least one message"), absl::string_view::npos) << outcomes[4].status;
}

TEST(ChatClusterTest, AModelWithoutATemplateRefusesChatsAndStillServesText) {
  auto cluster = ClusterHarness::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<lamina::v1::ListModelsResponse> models = (*cluster)->client().ListModels(absl::Seconds(10));
  ASSERT_TRUE(models.ok()) << models.status();
  EXPECT_FALSE(models->models(0).chat_template());

  lamina::v1::GenerateRequest text;
  text.set_text("The memory devices");
  text.set_max_tokens(6);
  text.set_ignore_eos(true);
  const std::vector<Outcome> outcomes =
      GenerateConcurrently((*cluster)->client(), {ChatRequest({{"user", "Hi"}}, 6), text});
  EXPECT_EQ(outcomes[0].status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(outcomes[0].status.message().find("has no chat template"), absl::string_view::npos) << outcomes[0].status;
  ASSERT_TRUE(outcomes[1].status.ok()) << outcomes[1].status;
  EXPECT_EQ(outcomes[1].ids.size(), 6u);
}

}  // namespace
}  // namespace lamina::testing

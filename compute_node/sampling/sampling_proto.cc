#include "compute_node/sampling/sampling_proto.h"

namespace lamina {

SamplingParams SamplingFromProto(const lamina::v1::SamplingParams& proto) {
  SamplingParams params;
  params.temperature = proto.temperature();
  params.top_k = proto.top_k();
  params.top_p = proto.top_p() != 0.0f ? proto.top_p() : 1.0f;
  params.min_p = proto.min_p();
  params.seed = proto.seed();
  params.logprobs = proto.logprobs();
  params.top_logprobs = proto.top_logprobs();
  params.repetition_penalty = proto.repetition_penalty() != 0.0f ? proto.repetition_penalty() : 1.0f;
  params.presence_penalty = proto.presence_penalty();
  params.frequency_penalty = proto.frequency_penalty();
  params.min_tokens = proto.min_tokens();
  params.min_tokens_stop_ids.assign(proto.min_tokens_stop_ids().begin(), proto.min_tokens_stop_ids().end());
  return params;
}

void SamplingToProto(const SamplingParams& params, lamina::v1::SamplingParams* proto) {
  proto->set_temperature(params.temperature);
  proto->set_top_k(params.top_k);
  proto->set_top_p(params.top_p);
  proto->set_min_p(params.min_p);
  proto->set_seed(params.seed);
  proto->set_logprobs(params.logprobs);
  proto->set_top_logprobs(params.top_logprobs);
  proto->set_repetition_penalty(params.repetition_penalty);
  proto->set_presence_penalty(params.presence_penalty);
  proto->set_frequency_penalty(params.frequency_penalty);
  proto->set_min_tokens(params.min_tokens);
  for (int32_t id : params.min_tokens_stop_ids) proto->add_min_tokens_stop_ids(id);
}

}  // namespace lamina

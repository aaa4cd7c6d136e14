// SamplingParams to and from lamina.v1.SamplingParams, where 0 stands for "off" in fields whose
// off value is not 0 (top_p, repetition_penalty: 1). The one place the fields are listed, for the
// API, the coordinator and the compute node.
#ifndef LAMINA_COMPUTE_NODE_SAMPLING_SAMPLING_PROTO_H_
#define LAMINA_COMPUTE_NODE_SAMPLING_SAMPLING_PROTO_H_

#include "compute_node/sampling/sampler.h"
#include "lamina/v1/generation.pb.h"

namespace lamina {

SamplingParams SamplingFromProto(const lamina::v1::SamplingParams& proto);
void SamplingToProto(const SamplingParams& params, lamina::v1::SamplingParams* proto);

}  // namespace lamina

#endif  // LAMINA_COMPUTE_NODE_SAMPLING_SAMPLING_PROTO_H_

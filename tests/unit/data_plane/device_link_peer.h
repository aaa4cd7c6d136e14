// What the device links' conformance suite (device_link_conformance_test.cc) and its peer program
// (device_link_peer.cc, the memory end in a process of its own, as a memory node is) say to each
// other over a tcp connection the suite listens on. Every request gets one kReply.
//
//   kJoin        {transport, device, LinkShape, offer}: CreateMemoryLinkEnd; the reply's bytes are
//                its answer
//   kServe       {step, rows, chunks, linked}: the memory end of a decode step, every layer queued
//                ahead as a memory node queues it (with `linked`, DirectHop where the link gives
//                one; else QueueReceive and QueueSend), with the received q (the first q_size
//                floats of each q/k/v row) as the "attention" output; the reply's bytes are every
//                layer's received rows, float [layers, rows, qkv_size]
//   kAwaitAbort  {step, rows, chunks, linked}: the same step queued, but no rows will come; the peer waits
//                for kAbort, then calls Abort; the reply says how long the waits took to end after it
//   kQuit        the peer exits (so it does when the connection closes)
#ifndef LAMINA_TESTS_UNIT_DATA_PLANE_DEVICE_LINK_PEER_H_
#define LAMINA_TESTS_UNIT_DATA_PLANE_DEVICE_LINK_PEER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/status/status_macros.h"
#include "common/transport/wire.h"
#include "data_plane/device_link.h"

namespace lamina::link_peer {

enum Type : uint32_t { kJoin = 1, kServe, kAwaitAbort, kAbort, kQuit, kReply };

struct Step {
  uint64_t step = 0;
  int64_t rows = 0;
  int32_t chunks = 1;
  bool linked = true;  // as AttentionExecutor::QueueDeviceDecode's
};

// A request's outcome: the memory end's status, what it sent back and, for kAwaitAbort, the
// milliseconds from Abort to the end of the step's waits.
struct Reply {
  absl::Status status;
  std::string bytes;
  double abort_ms = 0;
};

inline void PutShape(WireWriter& w, const LinkShape& s) {
  w.Put<int64_t>(s.num_layers);
  w.Put<int64_t>(s.qkv_size);
  w.Put<int64_t>(s.q_size);
  w.Put<int64_t>(s.max_rows);
  w.Put<int32_t>(s.max_chunks);
  w.Put<int64_t>(absl::ToInt64Milliseconds(s.timeout));
  w.Put<int64_t>(s.line_rows);
}

inline absl::Status GetShape(WireReader& r, LinkShape* s) {
  int64_t timeout_ms = 0;
  LAMINA_RETURN_IF_ERROR(r.Get(&s->num_layers));
  LAMINA_RETURN_IF_ERROR(r.Get(&s->qkv_size));
  LAMINA_RETURN_IF_ERROR(r.Get(&s->q_size));
  LAMINA_RETURN_IF_ERROR(r.Get(&s->max_rows));
  LAMINA_RETURN_IF_ERROR(r.Get(&s->max_chunks));
  LAMINA_RETURN_IF_ERROR(r.Get(&timeout_ms));
  LAMINA_RETURN_IF_ERROR(r.Get(&s->line_rows));
  s->timeout = absl::Milliseconds(timeout_ms);
  return absl::OkStatus();
}

inline void PutStep(WireWriter& w, const Step& s) {
  w.Put<uint64_t>(s.step);
  w.Put<int64_t>(s.rows);
  w.Put<int32_t>(s.chunks);
  w.Put<uint8_t>(s.linked ? 1 : 0);
}

inline absl::Status GetStep(WireReader& r, Step* s) {
  LAMINA_RETURN_IF_ERROR(r.Get(&s->step));
  LAMINA_RETURN_IF_ERROR(r.Get(&s->rows));
  LAMINA_RETURN_IF_ERROR(r.Get(&s->chunks));
  uint8_t linked = 1;
  LAMINA_RETURN_IF_ERROR(r.Get(&linked));
  s->linked = linked != 0;
  return absl::OkStatus();
}

inline void PutReply(WireWriter& w, const Reply& reply) {
  w.Put<int32_t>(static_cast<int32_t>(reply.status.code()));
  w.PutString(std::string(reply.status.message()));
  w.PutString(reply.bytes);
  w.Put<double>(reply.abort_ms);
}

inline absl::StatusOr<Reply> GetReply(WireReader& r) {
  int32_t code = 0;
  std::string message;
  Reply reply;
  LAMINA_RETURN_IF_ERROR(r.Get(&code));
  LAMINA_RETURN_IF_ERROR(r.GetString(&message));
  LAMINA_RETURN_IF_ERROR(r.GetString(&reply.bytes));
  LAMINA_RETURN_IF_ERROR(r.Get(&reply.abort_ms));
  reply.status = absl::Status(static_cast<absl::StatusCode>(code), message);
  return reply;
}

}  // namespace lamina::link_peer

#endif  // LAMINA_TESTS_UNIT_DATA_PLANE_DEVICE_LINK_PEER_H_

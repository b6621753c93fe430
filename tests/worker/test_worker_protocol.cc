// The controller <-> worker messages (worker/protocol.h): what one side encodes, the other
// decodes to the same values, through the frame channel's bytes.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <limits>

#include "engine/base/error.h"
#include "worker/frame_channel.h"
#include "worker/protocol.h"
#include "worker/worker.h"

namespace kvpr {
namespace {

json::Value through_the_wire(const json::Value& frame) { return json::parse(frame.dump()); }

TEST(WorkerProtocol, GenerateArrivesAsSent) {
  EngineRequest m;
  m.id = 1ull << 40;
  m.prompt = {1, 2, 50000};
  GenerationParams& g = m.params;
  g.max_new_tokens = 7;
  g.sampling.temperature = 0.7f;
  g.sampling.top_p = 0.9f;
  g.sampling.top_k = 40;
  g.sampling.min_p = 0.05f;
  g.sampling.seed = ~uint64_t{0};
  g.sampling.repetition_penalty = 1.1f;
  g.sampling.presence_penalty = -0.5f;
  g.sampling.frequency_penalty = 0.25f;
  g.sampling.logit_bias = {{3, -100.f}, {9, 2.5f}};
  g.stop = {"\n\n", "END"};
  g.stop_token_ids = {2, 7};
  g.ignore_eos = true;
  g.top_logprobs = 5;
  g.prompt_logprobs = 0;
  g.json_schema = json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})");
  const json::Value frame = through_the_wire(encode_generate(m));
  EXPECT_EQ(message_type(frame), "generate");
  const EngineRequest d = decode_generate(frame);
  EXPECT_EQ(d.id, m.id);
  EXPECT_EQ(d.prompt, m.prompt);
  const GenerationParams& e = d.params;
  EXPECT_EQ(e.max_new_tokens, 7);
  EXPECT_EQ(e.sampling.temperature, g.sampling.temperature);
  EXPECT_EQ(e.sampling.top_p, g.sampling.top_p);
  EXPECT_EQ(e.sampling.top_k, 40);
  EXPECT_EQ(e.sampling.min_p, g.sampling.min_p);
  EXPECT_EQ(e.sampling.seed, g.sampling.seed);
  EXPECT_EQ(e.sampling.repetition_penalty, g.sampling.repetition_penalty);
  EXPECT_EQ(e.sampling.presence_penalty, g.sampling.presence_penalty);
  EXPECT_EQ(e.sampling.frequency_penalty, g.sampling.frequency_penalty);
  EXPECT_EQ(e.sampling.logit_bias, g.sampling.logit_bias);
  EXPECT_EQ(e.stop, g.stop);
  EXPECT_EQ(e.stop_token_ids, g.stop_token_ids);
  EXPECT_TRUE(e.ignore_eos);
  EXPECT_EQ(e.top_logprobs, 5);
  EXPECT_EQ(e.prompt_logprobs, 0);
  EXPECT_EQ(e.json_schema.dump(), g.json_schema.dump());  // as the request gave it: the engine compiles it
  // Defaults stay defaults.
  const EngineRequest plain = decode_generate(through_the_wire(encode_generate(EngineRequest{})));
  EXPECT_FALSE(plain.params.sampling.seed);
  EXPECT_EQ(plain.params.prompt_logprobs, -1);
  EXPECT_TRUE(plain.params.json_schema.is_null());
  const json::Value cancel = through_the_wire(encode_cancel(5));
  EXPECT_EQ(message_type(cancel), "cancel");
  EXPECT_EQ(cancel.find("id")->as_int(), 5);
  EXPECT_EQ(message_type(encode_shutdown()), "shutdown");
  EXPECT_THROW(decode_generate(json::parse(R"({"type": "generate", "id": 1})")), Error);
}

TEST(WorkerProtocol, StepEventsArriveAsSent) {
  StepOutput o;
  o.id = 3;
  o.token = 11;
  o.logprob = -0.125f;
  o.top = {{11, -0.125f}, {12, -2.5f}};
  o.prompt_logprobs = {-1.5f, -0.75f};
  o.prompt_top = {{{4, -1.5f}}, {{5, -0.75f}, {6, -3.f}}};
  o.text = "h\xc3\xa9";
  o.finish = FinishReason::Length;
  SequenceResult r;
  r.prompt = {1, 2, 3};
  r.tokens = {11};
  r.cached_tokens = 2;
  const std::vector<RequestEvent> sent = {{9, engine_event(o, &r)}, {10, engine_event(StepOutput{}, nullptr)}};
  EXPECT_EQ(sent[0].event.finish_reason, "length");
  const std::vector<RequestEvent> got = decode_events(through_the_wire(encode_step(sent)));
  ASSERT_EQ(got.size(), 2u);
  const EngineEvent& a = got[0].event;
  EXPECT_EQ(got[0].id, 9u);
  EXPECT_EQ(a.token, 11);
  EXPECT_EQ(a.logprob, -0.125);
  EXPECT_EQ(a.top, sent[0].event.top);
  EXPECT_EQ(a.prompt_logprobs, sent[0].event.prompt_logprobs);
  EXPECT_EQ(a.prompt_top, sent[0].event.prompt_top);
  EXPECT_EQ(a.text, o.text);
  EXPECT_EQ(a.finish_reason, "length");
  EXPECT_EQ(a.prompt_tokens, 3);
  EXPECT_EQ(a.completion_tokens, 1);
  EXPECT_EQ(a.cached_tokens, 2);
  EXPECT_EQ(got[1].id, 10u);
  EXPECT_EQ(got[1].event.token, -1);
  EXPECT_TRUE(got[1].event.finish_reason.empty());
  const std::vector<RequestEvent> err = decode_events(through_the_wire(encode_error(4, "prompt too long")));
  ASSERT_EQ(err.size(), 1u);
  EXPECT_EQ(err[0].id, 4u);
  EXPECT_EQ(err[0].event.error, "prompt too long");
  EXPECT_FALSE(err[0].event.refused);
  // A refusal names the part of the request at fault, for the controller to name its field.
  const std::vector<RequestEvent> refused =
      decode_events(through_the_wire(encode_error(5, "a $ref loops", /*refused=*/true, "json_schema")));
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_TRUE(refused[0].event.refused);
  EXPECT_EQ(refused[0].event.refused_part, "json_schema");
  EXPECT_EQ(refused[0].event.error, "a $ref loops");
}

// Worker 0's NCCL id to kvprd and on to the others; the engine's description kvprd asks for.
TEST(WorkerProtocol, NcclIdAndDescriptionArriveAsSent) {
  const WorkerMessage m = decode_worker_message(through_the_wire(encode_nccl_id("00ff")));
  EXPECT_EQ(m.type, WorkerMessage::Type::NcclId);
  EXPECT_EQ(m.nccl_id, "00ff");
  EXPECT_EQ(message_type(encode_nccl_id("00ff")), "nccl_id");
  EngineDescription d;
  d.gpu_bus_ids = {"0000:17:00.0", "0000:65:00.0"};
  d.nccl = true;
  d.model_type = "llama";
  d.num_layers = 32;
  d.max_position_embeddings = 131072;
  d.vocab_size = 128256;
  const EngineDescription e = decode_description(through_the_wire(encode_description(d)));
  EXPECT_EQ(e.gpu_bus_ids, d.gpu_bus_ids);
  EXPECT_TRUE(e.nccl);
  EXPECT_EQ(e.model_type, "llama");
  EXPECT_EQ(e.num_layers, 32);
  EXPECT_EQ(e.max_position_embeddings, 131072);
  EXPECT_EQ(e.vocab_size, 128256);
  EXPECT_THROW(decode_description(json::parse(R"({"gpu_bus_ids": []})")), Error);
}

TEST(WorkerProtocol, ReadyStatsHeartbeatAndFatalArriveAsSent) {
  using T = WorkerMessage::Type;
  ReadyMessage r;
  r.worker = 2;
  r.backend = "cuda:1";
  r.kv_mode = "kvpr";
  r.max_seq_len = 2048;
  r.max_batch = 64;
  r.host_bytes_per_token = 524288;
  r.placement = json::Object{{"numa_node", 1}, {"cpus", json::Array{8, 9}}};
  WorkerMessage m = decode_worker_message(through_the_wire(encode_ready(r)));
  ASSERT_EQ(m.type, T::Ready);
  EXPECT_EQ(m.ready.worker, 2);
  EXPECT_EQ(m.ready.backend, "cuda:1");
  EXPECT_EQ(m.ready.kv_mode, "kvpr");
  EXPECT_EQ(m.ready.max_seq_len, 2048);
  EXPECT_EQ(m.ready.max_batch, 64);
  EXPECT_EQ(m.ready.host_bytes_per_token, 524288);
  EXPECT_EQ(m.ready.placement.dump(), r.placement.dump());

  WorkerStats s;
  s.running = 5;
  s.waiting = 7;
  s.split = 300;
  s.h2d_gbps = 52.5;
  s.host_kv_bytes = int64_t{3} << 40;  // past 32 bits
  s.host_kv_reserved_bytes = int64_t{4} << 40;
  s.device_bytes = 123456789;
  s.device_kv_bytes = int64_t{80} << 30;
  s.device_kv_used_bytes = int64_t{60} << 30;
  s.kv_resident_tokens = 30000;
  s.kv_staged_tokens = 2768;
  s.kv_tier = "host+device";
  s.steps = 1000;
  s.graph_replays = 990;
  s.spec_draft_tokens = 40;
  s.spec_accepted_tokens = 31;
  s.busy_fraction = 0.0;  // a whole-valued double: dumped as 0, read back as a number
  m = decode_worker_message(through_the_wire(encode_stats(s)));
  ASSERT_EQ(m.type, T::Stats);
  EXPECT_EQ(m.stats.running, 5);
  EXPECT_EQ(m.stats.waiting, 7);
  EXPECT_EQ(m.stats.split, 300);
  EXPECT_EQ(m.stats.h2d_gbps, 52.5);
  EXPECT_EQ(m.stats.host_kv_bytes, int64_t{3} << 40);
  EXPECT_EQ(m.stats.host_kv_reserved_bytes, int64_t{4} << 40);
  EXPECT_EQ(m.stats.device_bytes, 123456789);
  EXPECT_EQ(m.stats.device_kv_bytes, int64_t{80} << 30);
  EXPECT_EQ(m.stats.device_kv_used_bytes, int64_t{60} << 30);
  EXPECT_EQ(m.stats.kv_resident_tokens, 30000);
  EXPECT_EQ(m.stats.kv_staged_tokens, 2768);
  EXPECT_EQ(m.stats.kv_tier, "host+device");
  EXPECT_EQ(m.stats.steps, 1000);
  EXPECT_EQ(m.stats.graph_replays, 990);
  EXPECT_EQ(m.stats.spec_draft_tokens, 40);
  EXPECT_EQ(m.stats.spec_accepted_tokens, 31);
  EXPECT_EQ(m.stats.busy_fraction, 0.0);

  s.h2d_gbps = std::numeric_limits<double>::infinity();  // not finite: null on the wire, 0 here (as /metrics had it)
  m = decode_worker_message(through_the_wire(encode_stats(s)));
  ASSERT_EQ(m.type, T::Stats);
  EXPECT_EQ(m.stats.h2d_gbps, 0.0);
  EXPECT_EQ(m.stats.running, 5);

  m = decode_worker_message(through_the_wire(encode_heartbeat(1500)));
  ASSERT_EQ(m.type, T::Heartbeat);
  EXPECT_EQ(m.step_ms, 1500);
  m = decode_worker_message(through_the_wire(encode_fatal("out of memory")));
  ASSERT_EQ(m.type, T::Fatal);
  EXPECT_EQ(m.fatal, "out of memory");
  m = decode_worker_message(through_the_wire(encode_error(4, "prompt too long")));
  ASSERT_EQ(m.type, T::Events);
  ASSERT_EQ(m.events.size(), 1u);
  EXPECT_EQ(m.events[0].event.error, "prompt too long");
}

// kvprd decodes a worker's frames on its reader thread: one that is not a message it takes (an
// unknown type, a missing or mistyped field) is a kvpr::Error there, which ends that worker,
// never kvprd.
TEST(WorkerProtocol, AWorkerFrameThatIsNotAMessageIsAnError) {
  EXPECT_THROW(decode_worker_message(json::parse(R"({"type": "hello"})")), Error);
  EXPECT_THROW(decode_worker_message(json::parse(R"({"step_ms": 3})")), Error);
  EXPECT_THROW(decode_worker_message(json::parse(R"({"type": "heartbeat"})")), Error);
  EXPECT_THROW(decode_worker_message(json::parse(R"({"type": "heartbeat", "step_ms": "3"})")), Error);
  EXPECT_THROW(decode_worker_message(json::parse(R"({"type": "ready", "worker": 0, "backend": "cpu"})")), Error);
  json::Value stats = encode_stats(WorkerStats{});
  stats.set("running", "many");
  EXPECT_THROW(decode_worker_message(stats), Error);
  EXPECT_THROW(decode_worker_message(json::parse(R"({"type": "fatal"})")), Error);
  EXPECT_THROW(decode_worker_message(json::parse(R"({"type": "step", "events": 3})")), Error);
}

// A frame that does not parse is a kvpr::Error from recv (the worker then reports it and exits),
// and it is consumed: the frame after it arrives as sent.
TEST(WorkerProtocol, AFrameThatDoesNotParseIsAnErrorAndIsConsumed) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  FrameChannel a(sv[0]), b(sv[1]);
  const std::string deep = std::string(300, '[') + std::string(300, ']');
  std::string bad(4, '\0');
  const uint32_t n = static_cast<uint32_t>(deep.size());
  std::memcpy(bad.data(), &n, 4);
  a.send_frame(bad + deep);
  a.send(encode_cancel(7));
  json::Value msg;
  EXPECT_THROW(b.recv(&msg, 1000), Error);
  ASSERT_TRUE(b.recv(&msg, 1000));
  EXPECT_EQ(message_type(msg), "cancel");
  EXPECT_EQ(msg.find("id")->as_int(), 7);
}

}  // namespace
}  // namespace kvpr

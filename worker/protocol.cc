#include "worker/protocol.h"

#include "engine/base/error.h"

namespace kvpr {

namespace {

const json::Value& member(const json::Value& frame, std::string_view key) {
  const json::Value* v = frame.find(key);
  KVPR_CHECK(v, "worker message without '", key, "'");
  return *v;
}

std::vector<std::pair<int32_t, double>> pairs_of(const json::Value& a) {
  std::vector<std::pair<int32_t, double>> out;
  for (const auto& p : a.as_array())
    out.emplace_back(static_cast<int32_t>(p.as_array().at(0).as_int()), p.as_array().at(1).as_double());
  return out;
}

json::Value params_json(const GenerationParams& g) {
  const SamplingParams& s = g.sampling;
  json::Object p{{"max_tokens", g.max_new_tokens}, {"temperature", static_cast<double>(s.temperature)},
                 {"top_p", static_cast<double>(s.top_p)}, {"top_k", s.top_k}};
  if (s.min_p > 0) p.emplace_back("min_p", static_cast<double>(s.min_p));
  p.emplace_back("ignore_eos", g.ignore_eos);
  if (g.min_new_tokens > 0) p.emplace_back("min_tokens", g.min_new_tokens);
  if (g.top_logprobs > 0) p.emplace_back("top_logprobs", g.top_logprobs);
  if (g.prompt_logprobs >= 0) p.emplace_back("prompt_logprobs", g.prompt_logprobs);
  if (s.repetition_penalty != 1) p.emplace_back("repetition_penalty", static_cast<double>(s.repetition_penalty));
  if (s.presence_penalty != 0) p.emplace_back("presence_penalty", static_cast<double>(s.presence_penalty));
  if (s.frequency_penalty != 0) p.emplace_back("frequency_penalty", static_cast<double>(s.frequency_penalty));
  if (!s.logit_bias.empty()) p.emplace_back("logit_bias", logprob_pairs_json(s.logit_bias));
  if (g.json_object) p.emplace_back("json_object", true);
  if (!g.json_schema.is_null()) p.emplace_back("json_schema", g.json_schema);
  if (!g.constrain_after.empty())
    p.emplace_back("constrain_after", json::Array(g.constrain_after.begin(), g.constrain_after.end()));
  p.emplace_back("stop", json::Array(g.stop.begin(), g.stop.end()));
  if (!g.stop_token_ids.empty()) p.emplace_back("stop_token_ids", json::Array(g.stop_token_ids.begin(), g.stop_token_ids.end()));
  if (s.seed) p.emplace_back("seed", static_cast<int64_t>(*s.seed));
  return p;
}

GenerationParams params_of(const json::Value& p) {
  GenerationParams g;
  SamplingParams& s = g.sampling;
  auto number = [&](const char* key, auto* dst) {
    if (const json::Value* v = p.find(key)) *dst = static_cast<std::remove_pointer_t<decltype(dst)>>(v->as_double());
  };
  auto integer = [&](const char* key, int* dst) {
    if (const json::Value* v = p.find(key)) *dst = static_cast<int>(v->as_int());
  };
  integer("max_tokens", &g.max_new_tokens);
  integer("min_tokens", &g.min_new_tokens);
  number("temperature", &s.temperature);
  number("top_p", &s.top_p);
  integer("top_k", &s.top_k);
  number("min_p", &s.min_p);
  if (const json::Value* v = p.find("seed"); v && !v->is_null()) s.seed = static_cast<uint64_t>(v->as_int());
  if (const json::Value* v = p.find("ignore_eos")) g.ignore_eos = v->as_bool();
  integer("top_logprobs", &g.top_logprobs);
  integer("prompt_logprobs", &g.prompt_logprobs);
  number("repetition_penalty", &s.repetition_penalty);
  number("presence_penalty", &s.presence_penalty);
  number("frequency_penalty", &s.frequency_penalty);
  if (const json::Value* v = p.find("logit_bias"))
    for (const auto& [id, bias] : pairs_of(*v)) s.logit_bias.emplace_back(id, static_cast<float>(bias));
  if (const json::Value* v = p.find("stop"))
    for (const auto& st : v->as_array()) g.stop.push_back(st.as_string());
  if (const json::Value* v = p.find("stop_token_ids"))
    for (const auto& id : v->as_array()) g.stop_token_ids.push_back(static_cast<int32_t>(id.as_int()));
  if (const json::Value* v = p.find("json_object")) g.json_object = v->as_bool();
  if (const json::Value* v = p.find("json_schema")) g.json_schema = *v;
  if (const json::Value* v = p.find("constrain_after"))
    for (const auto& id : v->as_array()) g.constrain_after.push_back(static_cast<int32_t>(id.as_int()));
  return g;
}

json::Value event_json(const RequestEvent& re) {
  const EngineEvent& ev = re.event;
  json::Object e{{"id", static_cast<int64_t>(re.id)}};
  if (ev.token >= 0) {
    e.emplace_back("token", static_cast<int64_t>(ev.token));
    e.emplace_back("logprob", ev.logprob);
    if (!ev.top.empty()) e.emplace_back("top", logprob_pairs_json(ev.top));
  }
  if (!ev.prompt_logprobs.empty()) {
    e.emplace_back("prompt_logprobs", json::Array(ev.prompt_logprobs.begin(), ev.prompt_logprobs.end()));
    if (!ev.prompt_top.empty()) {
      json::Array tops;
      for (const auto& t : ev.prompt_top) tops.push_back(logprob_pairs_json(t));
      e.emplace_back("prompt_top", std::move(tops));
    }
  }
  e.emplace_back("text", ev.text);
  if (!ev.finish_reason.empty()) {
    e.emplace_back("finish_reason", ev.finish_reason);
    e.emplace_back("completion_tokens", ev.completion_tokens);
    e.emplace_back("prompt_tokens", ev.prompt_tokens);
    e.emplace_back("cached_tokens", ev.cached_tokens);
  }
  return e;
}

RequestEvent event_of(const json::Value& e) {
  RequestEvent re;
  re.id = static_cast<uint64_t>(member(e, "id").as_int());
  EngineEvent& ev = re.event;
  if (const json::Value* v = e.find("token")) ev.token = static_cast<int32_t>(v->as_int());
  if (const json::Value* v = e.find("logprob")) ev.logprob = v->as_double();
  if (const json::Value* v = e.find("top")) ev.top = pairs_of(*v);
  if (const json::Value* v = e.find("prompt_logprobs"))
    for (const auto& x : v->as_array()) ev.prompt_logprobs.push_back(x.as_double());
  if (const json::Value* v = e.find("prompt_top"))
    for (const auto& pt : v->as_array()) ev.prompt_top.push_back(pairs_of(pt));
  if (const json::Value* v = e.find("text")) ev.text = v->as_string();
  if (const json::Value* v = e.find("finish_reason")) ev.finish_reason = v->as_string();
  if (const json::Value* v = e.find("prompt_tokens")) ev.prompt_tokens = v->as_int();
  if (const json::Value* v = e.find("completion_tokens")) ev.completion_tokens = v->as_int();
  if (const json::Value* v = e.find("cached_tokens")) ev.cached_tokens = v->as_int();
  return re;
}

}  // namespace

std::string message_type(const json::Value& frame) {
  const json::Value* t = frame.find("type");
  return t && t->is_string() ? t->as_string() : "";
}

json::Value encode_generate(const EngineRequest& m) {
  return json::Object{{"type", "generate"},
                      {"id", static_cast<int64_t>(m.id)},
                      {"prompt_ids", json::Array(m.prompt.begin(), m.prompt.end())},
                      {"params", params_json(m.params)}};
}

EngineRequest decode_generate(const json::Value& frame) {
  EngineRequest m;
  m.id = static_cast<uint64_t>(member(frame, "id").as_int());
  for (const auto& t : member(frame, "prompt_ids").as_array()) m.prompt.push_back(static_cast<int32_t>(t.as_int()));
  m.params = params_of(member(frame, "params"));
  return m;
}

json::Value encode_cancel(uint64_t id) { return json::Object{{"type", "cancel"}, {"id", static_cast<int64_t>(id)}}; }
json::Value encode_shutdown() { return json::Object{{"type", "shutdown"}}; }

json::Value encode_step(const std::vector<RequestEvent>& events) {
  json::Array a;
  for (const auto& e : events) a.push_back(event_json(e));
  return json::Object{{"type", "step"}, {"events", std::move(a)}};
}

json::Value encode_error(uint64_t id, const std::string& message, bool refused, const std::string& part) {
  json::Object o{{"type", "error"}, {"id", static_cast<int64_t>(id)}, {"message", message}};
  if (refused) o.emplace_back("refused", true);
  if (!part.empty()) o.emplace_back("part", part);
  return o;
}

std::vector<RequestEvent> decode_events(const json::Value& frame) {
  std::vector<RequestEvent> out;
  if (message_type(frame) == "error") {
    RequestEvent re;
    re.id = static_cast<uint64_t>(member(frame, "id").as_int());
    re.event.error = member(frame, "message").as_string();
    const json::Value* refused = frame.find("refused");
    re.event.refused = refused && refused->is_bool() && refused->as_bool();
    if (const json::Value* part = frame.find("part"); part && part->is_string()) re.event.refused_part = part->as_string();
    out.push_back(std::move(re));
    return out;
  }
  for (const auto& e : member(frame, "events").as_array()) out.push_back(event_of(e));
  return out;
}

json::Value encode_ready(const ReadyMessage& m) {
  return json::Object{{"type", "ready"},
                      {"worker", m.worker},
                      {"backend", m.backend},
                      {"kv_mode", m.kv_mode},
                      {"max_seq_len", m.max_seq_len},
                      {"max_batch", m.max_batch},
                      {"host_bytes_per_token", m.host_bytes_per_token},
                      {"placement", m.placement}};
}

json::Value encode_fatal(const std::string& message) { return json::Object{{"type", "fatal"}, {"message", message}}; }

json::Value encode_stats(const WorkerStats& s) {
  return json::Object{{"type", "stats"},
                      {"running", s.running},
                      {"waiting", s.waiting},
                      {"split", s.split},
                      {"h2d_gbps", s.h2d_gbps},
                      {"host_kv_bytes", s.host_kv_bytes},
                      {"host_kv_reserved_bytes", s.host_kv_reserved_bytes},
                      {"device_bytes", s.device_bytes},
                      {"device_kv_bytes", s.device_kv_bytes},
                      {"device_kv_used_bytes", s.device_kv_used_bytes},
                      {"kv_resident_tokens", s.kv_resident_tokens},
                      {"kv_staged_tokens", s.kv_staged_tokens},
                      {"steps", s.steps},
                      {"graph_replays", s.graph_replays},
                      {"spec_draft_tokens", s.spec_draft_tokens},
                      {"spec_accepted_tokens", s.spec_accepted_tokens},
                      {"kv_tier", s.kv_tier},
                      {"kv_block_tokens", s.kv_block_tokens},
                      {"kv_blocks_total", s.kv_blocks_total},
                      {"kv_blocks_used", s.kv_blocks_used},
                      {"kv_blocks_cached", s.kv_blocks_cached},
                      {"preemptions", s.preemptions},
                      {"rope_recomputes", s.rope_recomputes},
                      {"ring_blocks_total", s.ring_blocks_total},
                      {"ring_blocks_used", s.ring_blocks_used},
                      {"prefix_query_tokens", s.prefix_query_tokens},
                      {"prefix_hit_tokens", s.prefix_hit_tokens},
                      {"busy_fraction", s.busy_fraction},
                      {"step_ms_max", s.step_ms_max}};
}

json::Value encode_nccl_id(const std::string& id) { return json::Object{{"type", "nccl_id"}, {"id", id}}; }

json::Value encode_description(const EngineDescription& d) {
  return json::Object{{"gpu_bus_ids", json::Array(d.gpu_bus_ids.begin(), d.gpu_bus_ids.end())},
                      {"nccl", d.nccl},
                      {"model_type", d.model_type},
                      {"num_layers", d.num_layers},
                      {"max_position_embeddings", d.max_position_embeddings},
                      {"vocab_size", d.vocab_size}};
}

EngineDescription decode_description(const json::Value& v) {
  EngineDescription d;
  for (const auto& b : member(v, "gpu_bus_ids").as_array()) d.gpu_bus_ids.push_back(b.as_string());
  d.nccl = member(v, "nccl").as_bool();
  d.model_type = member(v, "model_type").as_string();
  d.num_layers = member(v, "num_layers").as_int();
  d.max_position_embeddings = member(v, "max_position_embeddings").as_int();
  d.vocab_size = member(v, "vocab_size").as_int();
  return d;
}

json::Value encode_loaded() { return json::Object{{"type", "loaded"}}; }

json::Value encode_heartbeat(int64_t step_ms) { return json::Object{{"type", "heartbeat"}, {"step_ms", step_ms}}; }

WorkerMessage decode_worker_message(const json::Value& frame) {
  using T = WorkerMessage::Type;
  WorkerMessage m;
  const std::string type = message_type(frame);
  if (type == "step" || type == "error") {
    m.type = T::Events;
    m.events = decode_events(frame);
  } else if (type == "nccl_id") {
    m.type = T::NcclId;
    m.nccl_id = member(frame, "id").as_string();
  } else if (type == "loaded") {
    m.type = T::Loaded;
  } else if (type == "heartbeat") {
    m.type = T::Heartbeat;
    m.step_ms = member(frame, "step_ms").as_int();
  } else if (type == "stats") {
    m.type = T::Stats;
    WorkerStats& s = m.stats;
    for (auto [key, dst] : {std::pair{"running", &s.running}, {"waiting", &s.waiting}, {"split", &s.split},
                            {"host_kv_bytes", &s.host_kv_bytes}, {"host_kv_reserved_bytes", &s.host_kv_reserved_bytes},
                            {"device_bytes", &s.device_bytes}, {"device_kv_bytes", &s.device_kv_bytes},
                            {"device_kv_used_bytes", &s.device_kv_used_bytes},
                            {"kv_resident_tokens", &s.kv_resident_tokens}, {"kv_staged_tokens", &s.kv_staged_tokens},
                            {"steps", &s.steps}, {"graph_replays", &s.graph_replays},
                            {"spec_draft_tokens", &s.spec_draft_tokens},
                            {"spec_accepted_tokens", &s.spec_accepted_tokens}, {"kv_block_tokens", &s.kv_block_tokens},
                            {"kv_blocks_total", &s.kv_blocks_total}, {"kv_blocks_used", &s.kv_blocks_used},
                            {"kv_blocks_cached", &s.kv_blocks_cached}, {"preemptions", &s.preemptions},
                            {"rope_recomputes", &s.rope_recomputes},
                            {"ring_blocks_total", &s.ring_blocks_total}, {"ring_blocks_used", &s.ring_blocks_used},
                            {"prefix_query_tokens", &s.prefix_query_tokens}, {"prefix_hit_tokens", &s.prefix_hit_tokens},
                            {"step_ms_max", &s.step_ms_max}})
      *dst = member(frame, key).as_int();
    s.kv_tier = member(frame, "kv_tier").as_string();
    // A double that is not finite goes over the wire as null (json::dump): read as 0, as /metrics shows it.
    for (auto [key, dst] : {std::pair{"h2d_gbps", &s.h2d_gbps}, {"busy_fraction", &s.busy_fraction}})
      if (const json::Value& v = member(frame, key); !v.is_null()) *dst = v.as_double();
  } else if (type == "ready") {
    m.type = T::Ready;
    ReadyMessage& r = m.ready;
    r.worker = member(frame, "worker").as_int();
    r.backend = member(frame, "backend").as_string();
    r.kv_mode = member(frame, "kv_mode").as_string();
    r.max_seq_len = member(frame, "max_seq_len").as_int();
    r.max_batch = member(frame, "max_batch").as_int();
    r.host_bytes_per_token = member(frame, "host_bytes_per_token").as_int();
    r.placement = member(frame, "placement");
  } else if (type == "fatal") {
    m.type = T::Fatal;
    m.fatal = member(frame, "message").as_string();
  } else {
    KVPR_THROW("a worker message of type '", type, "', which the controller does not take");
  }
  return m;
}

}  // namespace kvpr

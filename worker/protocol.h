// The controller <-> worker messages as typed values, and their one encoding as frames (JSON
// objects: worker/PROTOCOL.md), used by both sides: kvprd's worker pool encodes a generate and
// decodes steps, kvpr-worker the other way round. A frame that is not what its type says is a
// kvpr::Error from decode.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/json.h"
#include "engine/contract/contract.h"

namespace kvpr {

// worker -> controller: one event of request `id` (a step carries one per running sequence).
struct RequestEvent {
  uint64_t id = 0;
  EngineEvent event;
};

// worker -> controller, once loaded: what it serves, and where (placement: its NUMA node, CPUs,
// binding, load time and weights, free-form for /health).
struct ReadyMessage {
  int64_t worker = 0;
  std::string backend, kv_mode;
  int64_t max_seq_len = 0, max_batch = 0, host_bytes_per_token = 0;
  json::Value placement;
};

// worker -> controller, every ~500 ms, for /metrics.
struct WorkerStats {
  int64_t running = 0, waiting = 0;  // sequences in the batch, and queued
  int64_t split = 0;                 // the last step's l (tokens recomputed per layer)
  double h2d_gbps = 0;               // the link's measured bandwidth
  int64_t host_kv_bytes = 0, host_kv_reserved_bytes = 0, device_bytes = 0;
  // kv mode auto: the device tier's bytes (allocated, mirroring host blocks now), and the last
  // step's cached tokens read in place there and staged (recomputed or copied over the link).
  int64_t device_kv_bytes = 0, device_kv_used_bytes = 0, kv_resident_tokens = 0, kv_staged_tokens = 0;
  int64_t steps = 0, graph_replays = 0;                   // since the worker started
  int64_t spec_draft_tokens = 0, spec_accepted_tokens = 0;  // since the worker started
  // Paged KV: the store's blocks now (kv_tier: "host", "device", or "host+device" for auto: where
  // the KV mode keeps them), and since the worker started the preemptions, the sequences computed again
  // past longrope's original context, and the prompt tokens looked up in the prefix cache and found.
  std::string kv_tier;
  int64_t kv_block_tokens = 0, kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_cached = 0;
  int64_t preemptions = 0, rope_recomputes = 0, prefix_query_tokens = 0, prefix_hit_tokens = 0;
  int64_t ring_blocks_total = 0, ring_blocks_used = 0;  // the sliding-window layers' ring, when kept
  double busy_fraction = 0;                                 // since the last stats message
  int64_t step_ms_max = 0;  // the longest step finished since the last stats message
};

// What kvprd asks the engine before it starts any worker (`kvpr-worker --describe`, one JSON
// line on stdout): the GPUs the worker binary sees and whether it can broadcast weights among
// them, and the model's shape as the engine reads its checkpoint. kvprd itself links no CUDA
// library and reads no checkpoint.
struct EngineDescription {
  std::vector<std::string> gpu_bus_ids;  // the CUDA devices in CUDA's order, by PCI bus id (none: no GPU)
  bool nccl = false;                     // this build broadcasts weights with NCCL
  std::string model_type;
  int64_t num_layers = 0, max_position_embeddings = 0, vocab_size = 0;
};
json::Value encode_description(const EngineDescription& d);
EngineDescription decode_description(const json::Value& v);

// A worker -> controller frame, decoded (kvprd's reader thread decodes each as it arrives: a
// frame that is not one of these ends the worker).
struct WorkerMessage {
  enum class Type { NcclId, Loaded, Ready, Fatal, Events, Stats, Heartbeat } type = Type::Heartbeat;
  std::string nccl_id;                // the weight broadcast's group, made by worker 0
  ReadyMessage ready;
  std::string fatal;                  // could not start: why
  std::vector<RequestEvent> events;   // a "step", or an "error" as one event
  WorkerStats stats;
  int64_t step_ms = 0;                // heartbeat: how long the current step has run (0 between steps)
};

// Several GPUs, the weight broadcast's NCCL group: worker 0 makes its id and sends it to the
// controller, which sends it on to the other workers, each waiting for it to join.
json::Value encode_nccl_id(const std::string& id);
json::Value encode_loaded();  // the weights are on the device (the NCCL broadcast, if any, is over)
json::Value encode_ready(const ReadyMessage& m);
json::Value encode_fatal(const std::string& message);
json::Value encode_stats(const WorkerStats& s);
json::Value encode_heartbeat(int64_t step_ms);
WorkerMessage decode_worker_message(const json::Value& frame);

// The frame's "type" ("" when it has none).
std::string message_type(const json::Value& frame);

// controller -> worker: queue a sequence (the controller's id, its prompt and parameters).
json::Value encode_generate(const EngineRequest& m);
EngineRequest decode_generate(const json::Value& frame);
json::Value encode_cancel(uint64_t id);
json::Value encode_shutdown();

// A step's events; an "error" frame (a request the worker refused) is one event with `error` set.
json::Value encode_step(const std::vector<RequestEvent>& events);
// refused: the engine refused the request (a client error), not failed it; `part`: which part
// of the request it refused (RequestRefused::part), when one.
json::Value encode_error(uint64_t id, const std::string& message, bool refused = false, const std::string& part = "");
std::vector<RequestEvent> decode_events(const json::Value& frame);  // of a "step" or an "error"

}  // namespace kvpr

// One worker: a model, its continuous-batching Generator and the request loop that serves the
// controller's messages (PROTOCOL.md) between engine steps.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/decode/engine_options.h"
#include "engine/decode/generator.h"
#include "worker/frame_channel.h"
#include "worker/protocol.h"

namespace kvpr {

struct WorkerOptions {
  std::string model_dir;
  std::string backend = "auto";
  int device = 0;
  int index = 0;               // worker number, for logs and stats
  EngineOptions engine;        // batch, context, KV mode and its settings, weights, profile
  int numa_node = -1;          // bind memory here (-1: no binding)
  // Several GPUs (nccl_ranks > 1): the weights are read by rank 0 and broadcast with NCCL.
  // Without an id rank 0 makes the group and sends its id to the controller, and the other
  // ranks wait for it over the channel (worker/PROTOCOL.md).
  std::string nccl_id;
  int nccl_rank = 0, nccl_ranks = 0;
  std::vector<int> cpus;       // bind to these CPUs (empty: no binding)
};

// The engine's output for one sequence as the contract's event (worker/protocol.h carries it);
// `finished` is the sequence's result when this output ends it.
EngineEvent engine_event(const StepOutput& out, const SequenceResult* finished);

// kvpr-worker --describe: the GPUs this binary sees (none with backend cpu), whether it can
// broadcast weights with NCCL, and the model's shape from its config (kvprd asks before it starts
// any worker).
EngineDescription describe_engine(const std::string& model_dir, const std::string& backend);

// Serves `channel` until the controller says shutdown or goes away. Returns the exit code.
int run_worker(const WorkerOptions& opts, FrameChannel& channel);

}  // namespace kvpr

// One worker: a model, its continuous-batching Generator and the request loop that serves the
// controller's messages (PROTOCOL.md) between engine steps.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/decode/engine_options.h"
#include "worker/frame_channel.h"

namespace kvpr {

struct WorkerOptions {
  std::string model_dir;
  std::string backend = "auto";
  int device = 0;
  int index = 0;               // worker number, for logs and stats
  EngineOptions engine;        // batch, context, KV mode and its settings, weights, profile
  int numa_node = -1;          // bind memory here (-1: no binding)
  std::string nccl_id;         // several GPUs: join this NCCL group to receive the weights
  int nccl_rank = 0, nccl_ranks = 0;
  std::vector<int> cpus;       // bind to these CPUs (empty: no binding)
};

// Serves `channel` until the controller says shutdown or goes away. Returns the exit code.
int run_worker(const WorkerOptions& opts, FrameChannel& channel);

}  // namespace kvpr

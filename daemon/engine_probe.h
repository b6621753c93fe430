// What kvprd learns from the engine before it starts any worker, by asking the worker binary
// (`kvpr-worker --describe`): the GPUs it sees, whether it broadcasts weights with NCCL, and the
// model's shape. kvprd links no CUDA library and reads no checkpoint itself: the engine's answers
// come from the engine.
#pragma once

#include <string>

#include "daemon/config.h"
#include "worker/protocol.h"

namespace kvpr {

// Runs `worker_binary --describe` for cfg's model and backend (at most `timeout_s`: starting
// CUDA on many GPUs takes seconds); kvpr::Error with the worker's own one-line error when it
// cannot answer.
EngineDescription probe_engine(const std::string& worker_binary, const DaemonConfig& cfg, double timeout_s = 300);

}  // namespace kvpr

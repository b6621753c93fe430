// kvpr-bench scale: N workers on one host decoding in lockstep (bench/scale.cc).
#pragma once

#include <string>
#include <vector>

namespace kvpr::scaling {

// The orchestrator: `kvpr-bench scale ...`.
int cmd_scale(const std::vector<std::string>& args);
// One of its workers (`kvpr-bench scale-worker ...`, started by cmd_scale, never by hand):
// commands on stdin, one JSON reply per line on fd 3.
int cmd_scale_worker(const std::vector<std::string>& args);

}  // namespace kvpr::scaling

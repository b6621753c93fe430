// kvpr-worker: one engine process, started by kvprd with one end of a socket pair.
//   kvpr-worker --fd N --model DIR [--backend auto|cpu|cuda] [--device D] [--index I]
//               [--numa-node N] [--cpus LIST] [--nccl-id ID --nccl-rank R --nccl-ranks N]
//               [--ENGINE-OPTION VALUE ...]  (engine/decode/engine_options.h, as kvprd's)
//   kvpr-worker --describe --model DIR [--backend auto|cpu|cuda]
//               what kvprd asks before starting workers: the GPUs, NCCL, the model's shape,
//               as one JSON line (worker/protocol.h EngineDescription)
#include <sys/prctl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/base/error.h"
#include "worker/worker.h"

int main(int argc, char** argv) {
  using namespace kvpr;
  ::prctl(PR_SET_DUMPABLE, 0);  // its memory holds prompts and KV: no core dump, no same-user ptrace
  WorkerOptions o;
  int fd = -1;
  bool describe = false;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto val = [&]() -> std::string {
        KVPR_CHECK(i + 1 < argc, a, " needs a value");
        return argv[++i];
      };
      if (a.starts_with("--"))
        if (const EngineOption* e = find_engine_option(std::string_view(a).substr(2))) {
          e->set(o.engine, val());
          continue;
        }
      if (a == "--fd") fd = std::stoi(val());
      else if (a == "--describe") describe = true;
      else if (a == "--model") o.model_dir = val();
      else if (a == "--backend") o.backend = val();
      else if (a == "--device") o.device = std::stoi(val());
      else if (a == "--index") o.index = std::stoi(val());
      else if (a == "--numa-node") o.numa_node = std::stoi(val());
      else if (a == "--nccl-id") o.nccl_id = val();
      else if (a == "--nccl-rank") o.nccl_rank = std::stoi(val());
      else if (a == "--nccl-ranks") o.nccl_ranks = std::stoi(val());
      else if (a == "--cpus") {
        std::string list = val();
        for (size_t p = 0; p < list.size();) {  // "0-3,8"
          size_t q = list.find(',', p);
          if (q == std::string::npos) q = list.size();
          std::string part = list.substr(p, q - p);
          size_t dash = part.find('-');
          int lo = std::stoi(part.substr(0, dash)), hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
          for (int c = lo; c <= hi; ++c) o.cpus.push_back(c);
          p = q + 1;
        }
      }
      else KVPR_THROW("unknown option '", a, "'");
    }
    KVPR_CHECK(!o.model_dir.empty(), "--model is required (kvpr-worker is started by kvprd)");
    if (describe) {
      std::printf("%s\n", encode_description(describe_engine(o.model_dir, o.backend)).dump().c_str());
      return 0;
    }
    KVPR_CHECK(fd >= 0, "--fd is required (kvpr-worker is started by kvprd)");
    validate(o.engine);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvpr-worker: %s\n", e.what());
    return 2;
  }
  // The compute thread pool takes the worker's share of the cores (read when first used).
  if (!o.cpus.empty() && !std::getenv("KVPR_THREADS"))
    setenv("KVPR_THREADS", std::to_string(o.cpus.size()).c_str(), 1);
  FrameChannel ch(fd);
  return run_worker(o, ch);
}

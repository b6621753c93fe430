// kvpr-worker: one engine process, started by kvprd with one end of a socket pair.
//   kvpr-worker --fd N --model DIR [--backend auto|cpu|cuda] [--device D] [--index I]
//               [--max-batch B] [--max-seq-len L] [--kv-mode M] [--split L] [--kv-dtype D]
//               [--activation-cap N] [--profile FILE] [--host-attention-threads N] [--cuda-graphs]
//               [--no-prefix-caching] [--permissive-json-whitespace] [--speculative-tokens N] [--prompt-lookup-max N] [--prompt-lookup-min N]
//               [--weights device|host] [--gpu-batches N]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/base/error.h"
#include "worker/worker.h"

int main(int argc, char** argv) {
  using namespace kvpr;
  WorkerOptions o;
  int fd = -1;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto val = [&]() -> std::string {
        KVPR_CHECK(i + 1 < argc, a, " needs a value");
        return argv[++i];
      };
      if (a == "--fd") fd = std::stoi(val());
      else if (a == "--model") o.model_dir = val();
      else if (a == "--backend") o.backend = val();
      else if (a == "--device") o.device = std::stoi(val());
      else if (a == "--index") o.index = std::stoi(val());
      else if (a == "--max-batch") o.generator.max_batch = std::stoi(val());
      else if (a == "--max-seq-len") o.generator.max_seq_len = std::stoll(val());
      else if (a == "--max-step-tokens") o.generator.max_step_tokens = std::stoll(val());
      else if (a == "--kv-mode") {
        std::string m = val();
        KVPR_CHECK(parse_kv_mode(m, &o.generator.kv.mode), "unknown --kv-mode '", m, "'");
      } else if (a == "--split") o.generator.kv.forced_split = std::stoll(val());
      else if (a == "--kv-dtype") {
        DType dt;
        std::string d = val();
        KVPR_CHECK(parse_dtype(d, &dt), "unknown --kv-dtype '", d, "'");
        o.generator.kv_dtype = dt;
      } else if (a == "--activation-cap") o.generator.kv.activation_cap = std::stoll(val());
      else if (a == "--profile") o.profile_path = val();
      else if (a == "--cuda-graphs") o.generator.cuda_graphs = true;
      else if (a == "--no-prefix-caching") o.generator.prefix_caching = false;
      else if (a == "--permissive-json-whitespace") o.generator.permissive_json_whitespace = true;
      else if (a == "--speculative-tokens") o.generator.speculative_tokens = std::stoi(val());
      else if (a == "--prompt-lookup-max") o.generator.prompt_lookup_max = std::stoi(val());
      else if (a == "--prompt-lookup-min") o.generator.prompt_lookup_min = std::stoi(val());
      else if (a == "--gpu-batches") o.generator.kv.gpu_batches = std::stoll(val());
      else if (a == "--weights") {
        std::string w = val();
        KVPR_CHECK(w == "device" || w == "host", "--weights: expected device or host, got '", w, "'");
        o.stream_weights = w == "host";
      }
      else if (a == "--host-attention-threads") o.generator.kv.host_attention_threads = std::stoi(val());
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
    KVPR_CHECK(fd >= 0 && !o.model_dir.empty(), "--fd and --model are required (kvpr-worker is started by kvprd)");
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

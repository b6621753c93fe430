// kvpr-bench: benchmarks (never timed tests). One file per subcommand; bench/README.md says what
// each measures. This file dispatches.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "bench/commands.h"
int main(int argc, char** argv) {
  std::vector<std::string> args(argv + std::min(argc, 2), argv + argc);
  try {
    if (argc >= 2 && std::string(argv[1]) == "cpu") return kvpr::bench::cmd_cpu(args);
    if (argc >= 2 && std::string(argv[1]) == "decode") return kvpr::bench::cmd_decode(args);
    if (argc >= 2 && std::string(argv[1]) == "ops") return kvpr::bench::cmd_ops(args);
    if (argc >= 2 && std::string(argv[1]) == "json") return kvpr::bench::cmd_json(args);
    if (argc >= 2 && std::string(argv[1]) == "schemas") return kvpr::bench::cmd_schemas(args);
    if (argc >= 2 && std::string(argv[1]) == "tokenize") return kvpr::bench::cmd_tokenize(args);
    if (argc >= 2 && std::string(argv[1]) == "serve") return kvpr::bench::cmd_serve(args);
    if (argc >= 2 && std::string(argv[1]) == "scale") return kvpr::bench::cmd_scale(args);
    if (argc >= 2 && std::string(argv[1]) == "scale-worker") return kvpr::bench::cmd_scale_worker(args);
    if (argc >= 2 && std::string(argv[1]) == "weights") return kvpr::bench::cmd_weights(args);
    std::fprintf(stderr, "usage: kvpr-bench cpu [--json FILE] [--quick]\n"
                         "       kvpr-bench decode [--preset P] [--batch B] [--prompt P] [--gen N] [--modes M,...]\n"
                         "                         [--backend B] [--kv-dtype D] [--weights device|host] [--gpu-batches N]\n"
                         "                         [--emulate-link-gbps G] [--peer F]\n"
                         "                         [--json F] [--svg F] [--trace-dir D] [--max-positions N]\n"
                         "                         [--weight-format dense|int4|int8|fp8|fp4] [--group G]\n"
                         "       kvpr-bench ops [--preset P] [--batch B] [--ctx S] [--reps N] [--backend B] [--json F]\n"
                         "       kvpr-bench json [--tokenizer DIR] [--reps N] [--json F]\n"
                         "       kvpr-bench schemas --file SAMPLE.jsonl [--tokenizer DIR] [--json F]\n"
                         "       kvpr-bench tokenize [--tokenizer DIR] [--corpus F] [--mib N] [--reps N] [--json F]\n"
                         "       kvpr-bench serve [--preset P] [--backend B] [--kv-mode M] [--kv-dtype D] [--conversations C]\n"
                         "                        [--prompt P] [--answer A] [--new N] [--decoders D] [--long-prompt L]\n"
                         "                        [--chunk K] [--json F]\n"
                         "       kvpr-bench scale [--preset P] [--workers 1,2,4,8] [--modes kvpr,offload,cpu-attn] [--batch B]\n"
                         "                        [--prompt P] [--gen N] [--kv-dtype D] [--backend B] [--real-workers R]\n"
                         "                        [--emulate-link-gbps G] [--probe-mib M] [--json F] [--svg F]\n"
                         "       kvpr-bench scale --topology XML [--workers 1,2,4,8]\n"
                         "       kvpr-bench weights [--preset P] [--formats bf16,int4,int8,fp8,fp4,int4+head] [--group G] [--prompt P]\n"
                         "                          [--gen N] [--layers N] [--json F]\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvpr-bench: error: %s\n", e.what());
    return 1;
  }
}

// kvpr-bench's subcommands, one file each (bench/<name>.cc); bench/main.cc dispatches on argv[1].
// Each takes the arguments after its name and returns the exit status; errors are exceptions.
#pragma once

#include <string>
#include <vector>

namespace kvpr::bench {

using Args = std::vector<std::string>;

int cmd_cpu(const Args& args);     // the CPU engine: prefill/decode tokens/s, attention vs memcpy
int cmd_decode(const Args& args);  // every KV mode side by side, with each mode's bounds
int cmd_ops(const Args& args);     // one decode layer's device ops, each timed alone
int cmd_json(const Args& args);    // constrained decoding's host cost per logits row
int cmd_schemas(const Args& args);  // real-world JSON Schemas: compiled, instances judged right
int cmd_tokenize(const Args& args);  // tokenizer MB/s with the fast splitters and with Oniguruma
int cmd_serve(const Args& args);   // prefix cache, chunked prefill, speculative decoding on and off
int cmd_scale(const Args& args);   // N workers on one host in lockstep (bench/scale.cc)
int cmd_weights(const Args& args);  // batch-1 CPU decode with quantized weights against BF16
// One of cmd_scale's workers (`kvpr-bench scale-worker ...`, started by it, never by hand):
// commands on stdin, one JSON reply per line on fd 3.
int cmd_scale_worker(const Args& args);

}  // namespace kvpr::bench

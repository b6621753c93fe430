// The bundled demo model: a deterministic tiny OPT with random weights and GPT-2's real
// tokenizer files, written as a Hugging Face directory (config.json, model.safetensors,
// vocab.json, merges.txt, tokenizer_config.json). Made by `kvpr make-demo-model`.
#pragma once

#include <string>

#include "engine/model/opt_config.h"

namespace kvpr {

struct DemoModelSpec {
  OptConfig config;      // defaults below: 4 layers, hidden 128, fp16 storage
  uint64_t seed = 2025;
  DType dtype = DType::F16;
};
DemoModelSpec default_demo_spec();

// Directory holding GPT-2's vocab.json and merges.txt: $KVPR_DATA_DIR/gpt2-tokenizer, the
// source tree's share/, or the installed share/kvpr/.
std::string default_tokenizer_dir();

// Writes the model into `out_dir` (created if needed). Same spec, same bytes.
void write_demo_model(const std::string& out_dir, const DemoModelSpec& spec, const std::string& tokenizer_dir);

}  // namespace kvpr

// The hyper-parameters every model has, whatever its architecture (OPT, Llama).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvpr {

struct ModelSpec {
  std::string model_type;  // "opt", "llama", "mistral", "qwen2", "qwen3"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;     // query heads
  int64_t num_kv_heads = 0;  // key/value heads (= num_heads without grouped-query attention)
  int64_t head_dim = 0;
  int64_t ffn_dim = 0;
  int64_t max_position_embeddings = 0;
  int64_t bos_token_id = -1, eos_token_id = -1, pad_token_id = -1;
  std::string torch_dtype;
  // Per layer, the sliding window its attention keeps (0: every key); empty: no layer slides.
  std::vector<int64_t> windows;
  // Longrope (Phi): a sequence longer than this many tokens turns by the long factors, all its
  // tokens (ForwardChunk::long_rope); 0: one rope for every length.
  int64_t long_rope_after = 0;
  int64_t kv_hidden() const { return num_kv_heads * head_dim; }
  int64_t q_width() const { return num_heads * head_dim; }  // Q and the attention output (Qwen3: not hidden_size)
};

}  // namespace kvpr

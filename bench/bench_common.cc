#include "bench/bench_common.h"

#include <atomic>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "engine/model/llama_model.h"
#include "engine/decode/sampling.h"
#include "engine/model/opt_model.h"
#include "engine/base/thread_pool.h"

namespace kvpr::bench {

EngineOptions engine_options_of(const Options& opt, std::initializer_list<const char*> names, EngineOptions o) {
  for (const char* name : names) {
    const EngineOption* e = find_engine_option(name + 2);
    KVPR_CHECK(e, name, " is not an engine option");
    const std::string v = opt.get(name, "");
    if (!v.empty()) e->set(o, v);
  }
  validate(o);
  return o;
}

void write_json(const std::string& path, const json::Value& v) {
  if (path.empty()) return;
  const std::string part = path + ".part";
  {
    std::ofstream o(part);
    o << v.dump() << "\n";
    KVPR_CHECK(o.good(), part, ": cannot write");
  }
  KVPR_CHECK(std::rename(part.c_str(), path.c_str()) == 0, path, ": cannot write: ", std::strerror(errno));
}

std::unique_ptr<Model> preset_model(Backend& be, const std::string& name, const ModelLoadOptions& lo,
                                    const PresetSize& size) {
  KVPR_CHECK(size.max_positions >= 0 && size.layers >= 0, "a preset's positions and layers must not be negative");
  if (name.rfind("llama", 0) != 0 && name.rfind("qwen", 0) != 0 && name.rfind("gemma", 0) != 0) {
    OptConfig oc = preset(name);
    if (size.max_positions > 0) oc.max_position_embeddings = size.max_positions;
    if (size.layers > 0) oc.num_layers = std::min(oc.num_layers, size.layers);
    return std::make_unique<OptModel>(be, oc, size.dtype, 1234, lo);
  }
  LlamaConfig c;
  c.vocab_size = 32000;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-5;
  c.torch_dtype = "float16";
  auto shape = [&](int64_t h, int64_t layers, int64_t heads, int64_t kv_heads, int64_t ffn) {
    c.hidden_size = h, c.num_layers = layers, c.num_heads = heads, c.num_kv_heads = kv_heads, c.intermediate_size = ffn;
  };
  if (name == "llama-2-7b") shape(4096, 32, 32, 32, 11008);
  else if (name == "llama-2-13b") shape(5120, 40, 40, 40, 13824);
  else if (name == "llama-2-70b") shape(8192, 80, 64, 8, 28672);  // grouped-query attention
  else if (name == "llama-3.1-8b") {  // grouped-query attention, 128256 tokens, llama3 rope scaling
    shape(4096, 32, 32, 8, 14336);
    c.vocab_size = 128256;
    c.max_position_embeddings = 131072;
    c.rope_theta = 500000;
    c.rope_llama3_factor = 8;
  } else if (name == "llama-3.2-1b") {  // grouped-query attention, 128256 tokens, the head tied
    shape(2048, 16, 32, 8, 8192);
    c.vocab_size = 128256;
    c.max_position_embeddings = 131072;
    c.rope_theta = 500000;
    c.rope_llama3_factor = 32;
    c.tie_word_embeddings = true;
    c.torch_dtype = "bfloat16";
  } else if (name == "llama-tiny") {
    shape(128, 4, 4, 2, 344);
  } else if (name.rfind("gemma-3", 0) == 0) {
    // Gemma 3 (gemma-3-4b-it's text model): 5 local layers (window 1024, base 1e4) to 1 global
    // (base 1e6, linear 8), heads of 256, q/k norms, GeGLU, (1 + w) and output norms, tied head.
    // gemma-3-tiny: its layer pattern and window on widths a CPU runs at 32k tokens.
    c.model_type = "gemma3_text";
    c.vocab_size = 262208;
    c.max_position_embeddings = 131072;
    c.rms_norm_eps = 1e-6;
    c.torch_dtype = "bfloat16";
    c.tie_word_embeddings = true;
    c.qk_norm = c.gemma_norms = true;
    c.mlp_activation = Activation::GELUTanh;
    c.config_head_dim = c.query_pre_attn_scalar = 256;
    c.rope_theta = 1e6, c.local_rope_theta = 1e4, c.rope_freq_scale = 1.0 / 8;
    c.sliding_window = 1024;
    if (name == "gemma-3-4b") {
      shape(2560, 34, 8, 4, 10240);
    } else if (name == "gemma-3-tiny") {
      shape(128, 6, 2, 1, 256);
      c.config_head_dim = c.query_pre_attn_scalar = 64;
      c.vocab_size = 1024;
    } else {
      KVPR_THROW("unknown preset '", name, "' (gemma-3-4b, gemma-3-tiny)");
    }
    for (int64_t i = 0; i < c.num_layers; ++i) c.sliding_layers.push_back((i + 1) % 6 != 0);
  } else if (name.rfind("qwen", 0) == 0) {  // 151936-row embeddings (152064 for 2.5-7B), theta 1e6
    c.vocab_size = 151936;
    c.max_position_embeddings = 32768;
    c.rope_theta = 1e6;
    c.rms_norm_eps = 1e-6;
    c.torch_dtype = "bfloat16";
    c.model_type = "qwen3";
    c.qk_norm = true;
    c.config_head_dim = 128;
    if (name == "qwen2.5-7b") {  // q/k/v biases, 4 KV heads
      shape(3584, 28, 28, 4, 18944);
      c.model_type = "qwen2";
      c.qk_norm = false;
      c.qkv_bias = true;
      c.config_head_dim = 0;
      c.vocab_size = 152064;
    } else if (name == "qwen3-8b") {
      shape(4096, 36, 32, 8, 12288);
    } else if (name == "qwen3-0.6b") {  // K+V (2 x 8 x 128) twice X (1024): recomputing pays
      shape(1024, 28, 16, 8, 3072);
      c.tie_word_embeddings = true;
    } else if (name == "qwen3-tiny") {  // heads of 64 on a hidden size of 128, as many KV heads
      shape(128, 4, 4, 4, 344);
      c.config_head_dim = 64;
      c.vocab_size = 1024;
      c.max_position_embeddings = 4096;
    } else {
      KVPR_THROW("unknown preset '", name, "' (qwen2.5-7b, qwen3-8b, qwen3-0.6b, qwen3-tiny)");
    }
  } else {
    KVPR_THROW("unknown preset '", name, "' (llama-2-7b, llama-2-13b, llama-2-70b, llama-3.1-8b, llama-3.2-1b, llama-tiny)");
  }
  if (size.max_positions > 0) c.max_position_embeddings = size.max_positions;
  if (size.layers > 0) c.num_layers = std::min(c.num_layers, size.layers);
  return std::make_unique<LlamaModel>(be, c, size.dtype, 1234, lo);
}

OptConfig preset(const std::string& name) {
  OptConfig c;
  c.vocab_size = 50272;
  c.max_position_embeddings = 2048;
  c.torch_dtype = "float16";
  if (name == "opt-6.7b") {
    c.hidden_size = 4096, c.num_layers = 32, c.num_heads = 32, c.ffn_dim = 16384;
  } else if (name == "opt-13b") {
    c.hidden_size = 5120, c.num_layers = 40, c.num_heads = 40, c.ffn_dim = 20480;
  } else if (name == "opt-30b") {
    c.hidden_size = 7168, c.num_layers = 48, c.num_heads = 56, c.ffn_dim = 28672;
  } else if (name == "opt-125m") {
    c.hidden_size = 768, c.num_layers = 12, c.num_heads = 12, c.ffn_dim = 3072;
  } else if (name == "opt-1.3b") {
    c.hidden_size = 2048, c.num_layers = 24, c.num_heads = 32, c.ffn_dim = 8192;
  } else if (name == "tiny") {
    c.hidden_size = 128, c.num_layers = 4, c.num_heads = 4, c.ffn_dim = 512;
  } else {
    KVPR_THROW("unknown preset '", name, "' (opt-6.7b, opt-13b, opt-30b, opt-1.3b, opt-125m, tiny)");
  }
  c.word_embed_proj_dim = c.hidden_size;
  return c;
}

double copy_ms(Backend& be, const Tensor& dst, const Tensor& src, Stream s, const char* what) {
  std::vector<double> ms;
  for (int r = 0; r < 4; ++r) {
    Event e0 = be.record(s);
    be.copy(dst, src, s, what);
    Event e1 = be.record(s);
    be.synchronize();
    if (r) ms.push_back(be.elapsed_ms(e0, e1));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double device_copy_gbps(Backend& be, int64_t bytes) {
  Tensor a = be.alloc(DType::U8, {bytes}), b = be.alloc(DType::U8, {bytes});
  return 2.0 * static_cast<double>(bytes) / (copy_ms(be, b, a, Stream::Compute, "hbm copy") / 1e3) / 1e9;
}

double recompute_gemm_tflops(Backend& be, int64_t hidden, int64_t kv_hidden, int64_t rows, DType wt) {
  Tensor x = be.alloc(DType::F32, {rows, hidden}), w = be.alloc(wt, {2, kv_hidden, hidden});
  be.fill_random(x, 1, 0.f, 1.f);
  be.fill_random(w, 2, 0.f, 0.02f);
  Tensor out = be.alloc(DType::F32, {2, rows, kv_hidden});
  std::vector<double> ms;
  for (int r = 0; r < 4; ++r) {
    Event e0 = be.record(Stream::Compute);
    be.linear_batched(out, x, w, Tensor(), Activation::None);
    Event e1 = be.record(Stream::Compute);
    be.synchronize();
    if (r) ms.push_back(be.elapsed_ms(e0, e1));
  }
  std::sort(ms.begin(), ms.end());
  return 4.0 * static_cast<double>(rows) * hidden * kv_hidden / (ms[ms.size() / 2] / 1e3) / 1e12;
}

double host_read_gbps(int64_t bytes) {
  const int64_t words = bytes / 8;
  std::vector<uint64_t> a(static_cast<size_t>(words), 1);
  ThreadPool& pool = ThreadPool::global();
  std::atomic<uint64_t> sink{0};
  auto read = [&] {
    pool.parallel_for(words, 1 << 17, [&](int64_t s, int64_t e) {
      uint64_t sum = 0;
      for (int64_t i = s; i < e; ++i) sum += a[static_cast<size_t>(i)];
      sink += sum;
    });
  };
  read();
  const double t = time_median(3, read);
  KVPR_CHECK(sink.load() > 0, "host_read_gbps: nothing read");
  return static_cast<double>(words * 8) / t / 1e9;
}

double host_copy_gbps(int64_t bytes) {
  std::vector<char> a(static_cast<size_t>(bytes), 1), b(static_cast<size_t>(bytes), 0);
  ThreadPool& pool = ThreadPool::global();
  auto copy = [&] {
    pool.parallel_for(bytes, 1 << 20, [&](int64_t s, int64_t e) { std::memcpy(b.data() + s, a.data() + s, e - s); });
  };
  copy();
  double t = time_median(3, copy);
  return 2.0 * static_cast<double>(bytes) / t / 1e9;
}

GreedyDecode::GreedyDecode(Backend& be, Model& model, KvRuntime& kv, int batch, int prompt, uint64_t seed)
    : be_(be), model_(model), kv_(kv), batch_(batch), prompt_(prompt) {
  const ModelSpec& c = model.spec();
  valid_ = static_cast<int32_t>(c.model_type == "opt" ? std::min<int64_t>(50257, c.vocab_size) : c.vocab_size);
  Rng rng(seed);
  seqs_.resize(static_cast<size_t>(batch));
  for (auto& s : seqs_)
    for (int i = 0; i < prompt; ++i) s.push_back(static_cast<int32_t>(3 + rng.next() % static_cast<uint64_t>(valid_ - 3)));
  if (kv.layout().block_tokens < kv.layout().max_tokens)
    pool_ = std::make_unique<BlockPool>(kv.layout().blocks, kv.layout().block_tokens);
  ids_dev_ = be.alloc(DType::I32, {batch});
  stats_dev_ = be.alloc(DType::F32, {batch, 2});
  ids_host_ = be.alloc_pinned(DType::I32, {batch});
  stats_host_ = be.alloc_pinned(DType::F32, {batch, 2});
}

ForwardChunk GreedyDecode::chunk(int b, const int32_t* tokens, int64_t count, int64_t past) {
  ForwardChunk c{tokens, count, past, b};
  if (!pool_) return c;
  std::vector<BlockPool::Copy> copies;
  const auto whole = std::span<const int32_t>(seqs_[static_cast<size_t>(b)]).first(static_cast<size_t>(past + count));
  KVPR_CHECK(pool_->allocate(b, whole, &copies, /*hits=*/0), "the bench's KV blocks ran out");
  c.blocks = pool_->table(b);
  return c;
}

double GreedyDecode::prefill() {
  const ModelSpec& c = model_.spec();
  Tensor logits = Tensor::host(DType::F32, {batch_, c.vocab_size});
  const auto t0 = Clock::now();
  const int group = std::max(1, 8192 / std::max(prompt_, 1));
  for (int b0 = 0; b0 < batch_; b0 += group) {
    std::vector<ForwardChunk> chunks;
    for (int b = b0; b < std::min(batch_, b0 + group); ++b) chunks.push_back(chunk(b, seqs_[b].data(), prompt_, 0));
    Tensor part = logits.rows(b0, static_cast<int64_t>(chunks.size()));
    model_.forward(chunks, kv_, part);
  }
  be_.synchronize();
  const double s = seconds_since(t0);
  for (int b = 0; b < batch_; ++b) {
    const float* row = logits.data_as<float>() + static_cast<int64_t>(b) * c.vocab_size;
    seqs_[b].push_back(static_cast<int32_t>(std::max_element(row, row + valid_) - row));
  }
  return s;
}

GreedyDecode::Step GreedyDecode::step(bool graphs) {
  Step r;
  const auto t_issue = Clock::now();
  std::vector<ForwardChunk> chunks;
  for (int b = 0; b < batch_; ++b) chunks.push_back(chunk(b, &seqs_[b].back(), 1, static_cast<int64_t>(seqs_[b].size()) - 1));
  GraphStepScope graph(be_, graphs);
  Tensor dev_logits = model_.forward_device(chunks, kv_);
  be_.argmax_lse(ids_dev_, stats_dev_, dev_logits, valid_);
  be_.copy(ids_host_, ids_dev_, Stream::Compute);
  be_.copy(stats_host_, stats_dev_, Stream::Compute);
  r.graph = graph.end();
  r.issue_ms = seconds_since(t_issue) * 1e3;
  be_.synchronize(be_.record(Stream::Compute));
  for (int b = 0; b < batch_; ++b) seqs_[b].push_back(ids_host_.data_as<int32_t>()[b]);
  return r;
}

}  // namespace kvpr::bench

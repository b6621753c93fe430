#include "engine/model/llama_config.h"

#include <cmath>

#include "engine/model/config_fields.h"
#include "engine/base/error.h"

namespace kvpr {

namespace {

// rope scaling "yarn"'s fields, applied by set_yarn once max_position_embeddings is known.
struct YarnFields {
  double factor = 0, original = 0, beta_fast = 0, beta_slow = 0, attention_factor = 0, mscale = 0, mscale_all_dim = 0;
  bool truncate = true;
};

bool is_gemma(const std::string& model_type) { return model_type == "gemma2" || model_type == "gemma3_text"; }

// Which layers slide (LlamaConfig::sliding_layers): layer_types where given, else the family's
// rule, as transformers' configs build layer_types.
void read_layer_types(const ConfigFields& f, LlamaConfig& c) {
  const std::string& source = f.source();
  const int64_t L = c.num_layers;
  c.sliding_layers.assign(static_cast<size_t>(L), 0);
  if (const json::Value* lt = f.find("layer_types")) {
    KVPR_CHECK(lt->is_array() && static_cast<int64_t>(lt->as_array().size()) == L, source,
               ": layer_types must list one type per layer (", L, ")");
    for (int64_t i = 0; i < L; ++i) {
      const json::Value& t = lt->as_array()[static_cast<size_t>(i)];
      const std::string type = t.is_string() ? t.as_string() : "";
      KVPR_CHECK(type == "sliding_attention" || type == "full_attention", source, ": layer_types[", i, "] \"", type,
                 "\" is not supported (sliding_attention, full_attention)");
      c.sliding_layers[static_cast<size_t>(i)] = type == "sliding_attention";
    }
    return;
  }
  if (c.model_type.rfind("qwen", 0) == 0) {
    // Qwen2 slides only with use_sliding_window, and then the layers from max_window_layers on;
    // its released configs carry a sliding_window with use_sliding_window false: full attention.
    bool use_sliding_window = false;
    f.get_bool("use_sliding_window", &use_sliding_window);
    int64_t max_window_layers = 0;
    f.get_int("max_window_layers", &max_window_layers);
    for (int64_t i = 0; i < L; ++i) c.sliding_layers[static_cast<size_t>(i)] = use_sliding_window && i >= max_window_layers;
  } else if (c.model_type == "gemma2" || c.model_type == "gpt_oss") {  // layer i slides when (i + 1) % 2 != 0
    for (int64_t i = 0; i < L; ++i) c.sliding_layers[static_cast<size_t>(i)] = i % 2 == 0;
  } else if (c.model_type == "gemma3_text") {  // Gemma3TextConfig: all but every pattern-th
    int64_t pattern = 6;
    f.get_int("_sliding_window_pattern", &pattern);
    f.get_int("sliding_window_pattern", &pattern);
    KVPR_CHECK(pattern > 0, source, ": sliding_window_pattern must be positive");
    for (int64_t i = 0; i < L; ++i) c.sliding_layers[static_cast<size_t>(i)] = (i + 1) % pattern != 0;
  } else {  // Mistral (and Llama-shaped configs that set one): every layer
    c.sliding_layers.assign(static_cast<size_t>(L), 1);
  }
}

// The sliding window, the projections' biases, Qwen3's and Gemma 3's norms of Q and K, Gemma's
// scores and caps.
void read_attention(const ConfigFields& f, LlamaConfig& c) {
  const std::string& source = f.source();
  // A null sliding_window is none; Gemma's configs that omit it mean the class default.
  if (f.is_null("sliding_window")) c.sliding_window = 0;
  f.get_int("sliding_window", &c.sliding_window);
  KVPR_CHECK(c.sliding_window >= 0, source, ": sliding_window must not be negative");
  read_layer_types(f, c);
  if (c.model_type.rfind("qwen", 0) == 0) {  // Qwen2Config: no window unless use_sliding_window, layer_types or not
    bool use_sliding_window = false;
    f.get_bool("use_sliding_window", &use_sliding_window);
    if (!use_sliding_window) c.sliding_window = 0;
  }
  f.get_double("query_pre_attn_scalar", &c.query_pre_attn_scalar);
  for (auto [name, out] : {std::pair{"attn_logit_softcapping", &c.attn_softcap}, {"final_logit_softcapping", &c.final_softcap}}) {
    if (f.is_null(name)) *out = 0;  // null: none
    f.get_double(name, out);
    KVPR_CHECK(*out >= 0 && std::isfinite(*out), source, ": ", name, " must be finite and not negative");
  }
  KVPR_CHECK(c.query_pre_attn_scalar >= 0, source, ": query_pre_attn_scalar must not be negative");
  if (c.model_type == "qwen2" || c.model_type == "qwen2_moe") {  // Qwen2Attention: q/k/v with biases, o_proj
                                                                  // without; no config field says so
    c.qkv_bias = true;
  } else if (c.model_type == "gpt_oss") {  // GptOssConfig forces attention_bias; sinks in every layer
    c.qkv_bias = c.o_bias = true;
    c.attention_sinks = true;
  } else {
    bool attention_bias = false;
    f.get_bool("attention_bias", &attention_bias);
    c.qkv_bias = c.o_bias = attention_bias;
  }
  c.qk_norm = c.model_type == "qwen3" || c.model_type == "qwen3_moe" || c.model_type == "gemma3_text";
  c.fused_projections = c.model_type == "phi3";
}

// Rotary embedding: rope_theta (transformers 4) or rope_parameters (transformers 5), and
// rope_scaling, of which kvpr runs none ("default"), "linear", "llama3" and "yarn".
YarnFields read_rope(const ConfigFields& f, LlamaConfig& c) {
  const std::string& source = f.source();
  YarnFields yarn;
  f.get_double("rope_theta", &c.rope_theta);
  f.get_double("rope_local_base_freq", &c.local_rope_theta);
  const json::Value* scaling = f.find("rope_scaling");
  if (const json::Value* rp = f.find("rope_parameters")) {
    // transformers 5 keys Gemma 3's by layer type: the full layers' (with their scaling) and the
    // sliding layers' (unscaled, their own base).
    if (const json::Value* full = rp->find("full_attention"); full && full->is_object()) {
      if (const json::Value* sl = rp->find("sliding_attention"); sl && sl->is_object()) {
        ConfigFields local(*sl, source + ": rope_parameters.sliding_attention");
        std::string type = "default";
        local.get_string("rope_type", &type);
        KVPR_CHECK(type == "default", source, ": sliding layers' rope_type \"", type, "\" is not supported (default)");
        local.get_double("rope_theta", &c.local_rope_theta);
      }
      rp = full;
    }
    ConfigFields p(*rp, source + ": rope_parameters");
    p.get_double("rope_theta", &c.rope_theta);
    if (p.find("rope_type") || p.find("type")) scaling = rp;
  }
  f.get_double("partial_rotary_factor", &c.partial_rotary_factor);
  KVPR_CHECK(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1, source, ": partial_rotary_factor ",
             c.partial_rotary_factor, " must be in (0, 1]");
  KVPR_CHECK(c.local_rope_theta >= 0, source, ": rope_local_base_freq must not be negative");
  if (!scaling) return yarn;
  ConfigFields s(*scaling, source + ": rope scaling");
  std::string type = "default";
  s.get_string("type", &type);
  s.get_string("rope_type", &type);
  if (type == "linear") {
    double factor = 1.0;
    s.get_double("factor", &factor);
    KVPR_CHECK(factor > 0, source, ": rope scaling factor must be positive");
    c.rope_freq_scale = 1.0 / factor;
  } else if (type == "llama3") {
    s.get_double("factor", &c.rope_llama3_factor, true);
    s.get_double("low_freq_factor", &c.rope_low_freq_factor, true);
    s.get_double("high_freq_factor", &c.rope_high_freq_factor, true);
    s.get_double("original_max_position_embeddings", &c.rope_original_max_position, true);
    KVPR_CHECK(c.rope_llama3_factor > 0 && c.rope_low_freq_factor > 0 && c.rope_original_max_position > 0, source,
               ": llama3 rope scaling needs a positive factor, low_freq_factor and original_max_position_embeddings");
    KVPR_CHECK(c.rope_high_freq_factor > c.rope_low_freq_factor, source,
               ": llama3 rope scaling needs high_freq_factor above low_freq_factor");
  } else if (type == "yarn") {
    // As transformers' _compute_yarn_parameters (and vLLM's YaRN) read it: the factor as given;
    // the correction range measured against original_max_position_embeddings (else
    // max_position_embeddings); the attention factor given, else from mscale and mscale_all_dim
    // where both are set, else 0.1 ln(factor) + 1.
    s.get_double("factor", &yarn.factor, true);
    KVPR_CHECK(yarn.factor > 0, source, ": yarn rope scaling factor must be positive");
    s.get_double("original_max_position_embeddings", &yarn.original);
    s.get_double("beta_fast", &yarn.beta_fast);
    s.get_double("beta_slow", &yarn.beta_slow);
    s.get_double("attention_factor", &yarn.attention_factor);
    KVPR_CHECK(!s.find("attention_factor") || yarn.attention_factor > 0, source,
               ": yarn rope scaling attention_factor must be positive");
    s.get_double("mscale", &yarn.mscale);
    s.get_double("mscale_all_dim", &yarn.mscale_all_dim);
    s.get_bool("truncate", &yarn.truncate);
  } else if (type == "longrope" || type == "su") {
    // As transformers' _compute_longrope_parameters reads it: the original context from the
    // config (or the scaling's own field, transformers 5), max_position_embeddings without one;
    // the attention factor given, else sqrt(1 + ln(factor) / ln(original)) with factor =
    // max_position_embeddings / original (1 at or below 1).
    auto factors = [&](const char* name, std::vector<double>* out) {
      const json::Value* v = s.find(name);
      KVPR_CHECK(v && v->is_array() && !v->as_array().empty(), source, ": longrope rope scaling needs a list ", name);
      for (const json::Value& x : v->as_array()) {
        out->push_back(x.as_double());
        KVPR_CHECK(std::isfinite(out->back()) && out->back() > 0, source, ": longrope ", name, " must be positive");
      }
    };
    factors("short_factor", &c.longrope_short);
    factors("long_factor", &c.longrope_long);
    f.get_int("original_max_position_embeddings", &c.longrope_original);
    s.get_int("original_max_position_embeddings", &c.longrope_original);
    double attention_factor = 0;
    s.get_double("attention_factor", &attention_factor);
    KVPR_CHECK(!s.find("attention_factor") || attention_factor > 0, source,
               ": longrope rope scaling attention_factor must be positive");
    c.rope_attention_factor = attention_factor;  // 0: from the contexts, once both are known
  } else {
    KVPR_CHECK(type == "default", source, ": rope scaling type \"", type,
               "\" is not supported (default, linear, llama3, yarn, longrope)");
  }
  return yarn;
}

// head_dim, and grouped-query attention's heads.
void check_heads(const ConfigFields& f, LlamaConfig& c) {
  const std::string& source = f.source();
  if (const json::Value* hd = f.find("head_dim"); hd && !hd->is_null()) {  // explicit: any even width
    f.get_int("head_dim", &c.config_head_dim);
    KVPR_CHECK(c.config_head_dim > 0 && c.config_head_dim % 2 == 0, source, ": head_dim ", c.config_head_dim,
               " must be positive and even");
  } else {
    KVPR_CHECK(c.hidden_size % c.num_heads == 0 && c.head_dim() % 2 == 0, source, ": hidden_size ", c.hidden_size,
               " is not divisible into ", c.num_heads, " heads of an even size");
  }
  // Grouped-query attention (Llama-2-70B, TinyLlama): every KV head serves the same number of
  // query heads.
  KVPR_CHECK(c.num_kv_heads <= c.num_heads && c.num_heads % c.num_kv_heads == 0, source, ": num_key_value_heads ",
             c.num_kv_heads, " does not divide num_attention_heads ", c.num_heads);
  KVPR_CHECK(c.vocab_size < (int64_t{1} << 31), source, ": vocab_size too large");
  KVPR_CHECK(c.rope_dim() > 0 && c.rope_dim() % 2 == 0, source, ": partial_rotary_factor ", c.partial_rotary_factor,
             " turns ", c.rope_dim(), " of ", c.head_dim(), " elements of a head, which must be a positive even number");
}


// The text model's config of a ForConditionalGeneration wrapper (gemma3, mistral3): its
// text_config, with the fields its configs keep at the top level (dtype, token ids) where the
// text_config lacks them.
json::Value text_config(const json::Value& v, const std::string& wrapper, const std::string& source) {
  const json::Value* tc = v.find("text_config");
  KVPR_CHECK(tc && tc->is_object(), source, ": model_type \"", wrapper, "\" needs a text_config object");
  json::Value t = *tc;
  const char* text_type = wrapper == "gemma3" ? "gemma3_text" : "mistral";
  if (!t.find("model_type")) t.set("model_type", text_type);
  const json::Value* mt = t.find("model_type");
  KVPR_CHECK(mt->is_string() && mt->as_string() == text_type, source, ": text_config model_type \"",
             mt->is_string() ? mt->as_string() : mt->dump(), "\" is not supported in a ", wrapper, " checkpoint (",
             text_type, ")");
  for (const char* key : {"torch_dtype", "dtype", "bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings"})
    if (const json::Value* x = v.find(key); x && !t.find(key)) t.set(key, *x);
  return t;
}

// The class defaults of Gemma's configs, which real configs lean on (Gemma 3's text_config lists
// a handful of fields): Gemma2Config's and Gemma3TextConfig's.
void gemma_defaults(LlamaConfig& c) {
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = true;
  c.config_head_dim = 256;
  c.query_pre_attn_scalar = 256;
  c.sliding_window = 4096;
  c.mlp_activation = Activation::GELUTanh;
  c.gemma_norms = true;
  c.bos_token_id = 2, c.eos_token_id = 1, c.pad_token_id = 0;
  if (c.model_type == "gemma2") {
    c.attn_softcap = 50, c.final_softcap = 30;
    c.vocab_size = 256000, c.hidden_size = 2304, c.intermediate_size = 9216, c.num_layers = 26;
    c.num_heads = 8, c.num_kv_heads = 4, c.max_position_embeddings = 8192;
  } else {
    c.vocab_size = 262208, c.hidden_size = 2304, c.intermediate_size = 9216, c.num_layers = 26;
    c.num_heads = 8, c.num_kv_heads = 4, c.max_position_embeddings = 131072;
    c.rope_theta = 1000000.0, c.local_rope_theta = 10000.0;
  }
}

// The gated MLP's activation, transformers' ACT2FN name (Gemma: hidden_activation, else hidden_act).
void read_activation(const ConfigFields& f, LlamaConfig& c) {
  std::string act;
  f.get_string("hidden_act", &act);
  if (is_gemma(c.model_type)) f.get_string("hidden_activation", &act);
  if (c.model_type == "gpt_oss") {  // its experts' own gate; hidden_act is unused
    double limit = 7.0;
    f.get_double("swiglu_limit", &limit);
    KVPR_CHECK(limit == 7.0, f.source(), ": swiglu_limit ", limit, " is not supported (7.0, gpt-oss's)");
    c.mlp_activation = Activation::ClampedSwiGLU;
    return;
  }
  if (act.empty()) return;
  if (act == "silu" || act == "swish") c.mlp_activation = Activation::SiLU;
  else if (act == "gelu") c.mlp_activation = Activation::GELU;
  else if (act == "gelu_pytorch_tanh" || act == "gelu_new") c.mlp_activation = Activation::GELUTanh;
  else KVPR_THROW(f.source(), ": hidden_act \"", act, "\" is not supported (silu, gelu, gelu_pytorch_tanh)");
}

}  // namespace

LlamaConfig LlamaConfig::from_json(const json::Value& top, const std::string& top_source) {
  LlamaConfig c;
  ConfigFields(top, top_source).get_string("model_type", &c.model_type, true);
  KVPR_CHECK(is_llama_family(c.model_type), top_source, ": model_type \"", c.model_type, "\" is not ",
             llama_family_names());
  json::Value text;
  std::string source = top_source;
  if (c.model_type == "gemma3" || c.model_type == "mistral3") {
    c.wrapper = c.model_type;
    text = text_config(top, c.wrapper, top_source);
    source = top_source + ": text_config";
  }
  const json::Value& v = c.wrapper.empty() ? top : text;
  ConfigFields f(v, source);
  f.get_string("model_type", &c.model_type, true);
  // Gemma 3's text_config may omit every size: the class defaults apply.
  const bool sparse = c.model_type == "gemma3_text";
  if (is_gemma(c.model_type)) gemma_defaults(c);
  f.get_int("vocab_size", &c.vocab_size, !sparse);
  f.get_int("hidden_size", &c.hidden_size, !sparse);
  f.get_int("intermediate_size", &c.intermediate_size, !sparse);
  f.get_int("num_hidden_layers", &c.num_layers, !sparse);
  f.get_int("num_attention_heads", &c.num_heads, !sparse);
  if (!is_gemma(c.model_type)) c.num_kv_heads = c.num_heads;
  f.get_int("num_key_value_heads", &c.num_kv_heads);
  f.get_int("max_position_embeddings", &c.max_position_embeddings, !sparse);
  f.get_double("rms_norm_eps", &c.rms_norm_eps);
  f.get_bool("tie_word_embeddings", &c.tie_word_embeddings);
  f.get_bool("mlp_bias", &c.mlp_bias);
  f.get_int("bos_token_id", &c.bos_token_id);
  f.get_int("pad_token_id", &c.pad_token_id);
  if (const json::Value* e = f.find("eos_token_id"); e && e->is_array()) {  // several stop ids: the first
    KVPR_CHECK(!e->as_array().empty(), source, ": \"eos_token_id\" is an empty list");
    c.eos_token_id = e->as_array().front().as_int();
  } else {
    f.get_int("eos_token_id", &c.eos_token_id);
  }
  // transformers >= 4.56 writes "dtype"; earlier ones "torch_dtype" (read last: it wins when both are there).
  f.get_string("dtype", &c.torch_dtype);
  f.get_string("torch_dtype", &c.torch_dtype);
  read_activation(f, c);
  read_attention(f, c);
  const YarnFields yarn = read_rope(f, c);
  KVPR_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_layers > 0 &&
                 c.num_heads > 0 && c.num_kv_heads > 0 && c.max_position_embeddings > 0 && c.rms_norm_eps > 0 &&
                 c.rope_theta > 0,
             source, ": sizes must be positive");
  read_moe(f, c);
  check_heads(f, c);
  if (yarn.factor > 0) c.set_yarn(yarn.factor, yarn.original > 0 ? yarn.original : double(c.max_position_embeddings),
                                  yarn.beta_fast, yarn.beta_slow, yarn.attention_factor, yarn.mscale,
                                  yarn.mscale_all_dim, yarn.truncate, source);
  if (!c.longrope_short.empty()) c.set_longrope(source);
  return c;
}

namespace {
const char* const kLlamaFamily[] = {"llama",  "mistral",     "mixtral", "qwen2",  "qwen2_moe", "qwen3",
                                    "qwen3_moe", "gemma2", "gemma3_text", "gemma3", "mistral3", "phi3", "gpt_oss"};
}  // namespace

bool is_llama_family(const std::string& model_type) {
  for (const char* t : kLlamaFamily)
    if (model_type == t) return true;
  return false;
}

const char* llama_family_names() {
  return "llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, gemma2, gemma3_text, gemma3, mistral3, phi3 "
         "or gpt_oss";
}

void LlamaConfig::read_moe(const ConfigFields& f, LlamaConfig& c) {
  const std::string& source = f.source();
  if (c.model_type == "mixtral") {  // MixtralSparseMoeBlock: every layer, experts as wide as intermediate_size
    f.get_int("num_local_experts", &c.num_experts, true);
    f.get_int("num_experts_per_tok", &c.experts_per_token, true);
    c.moe_intermediate_size = c.intermediate_size;
    c.norm_topk_prob = true;  // router_jitter_noise is training only
  } else if (c.model_type == "gpt_oss") {  // GptOssMLP: every layer, top-k then softmax over the k
    f.get_int("num_local_experts", &c.num_experts, true);
    f.get_int("num_experts_per_tok", &c.experts_per_token, true);
    c.moe_intermediate_size = c.intermediate_size;
    c.norm_topk_prob = true;  // softmax over the chosen k = the softmax over all, renormalised
    c.router_bias = c.expert_bias = true;
  } else if (c.model_type == "qwen2_moe" || c.model_type == "qwen3_moe") {
    f.get_int("num_experts", &c.num_experts, true);
    f.get_int("num_experts_per_tok", &c.experts_per_token, true);
    f.get_int("moe_intermediate_size", &c.moe_intermediate_size, true);
    c.norm_topk_prob = c.model_type == "qwen3_moe";  // transformers' defaults for each
    f.get_bool("norm_topk_prob", &c.norm_topk_prob);
    f.get_int("decoder_sparse_step", &c.decoder_sparse_step);
    if (const json::Value* m = f.find("mlp_only_layers")) {
      KVPR_CHECK(m->is_array(), source, ": mlp_only_layers must be a list of layer indices");
      for (const json::Value& i : m->as_array()) c.mlp_only_layers.push_back(i.as_int());
    }
    if (c.model_type == "qwen2_moe") f.get_int("shared_expert_intermediate_size", &c.shared_expert_intermediate_size);
  } else {
    return;
  }
  KVPR_CHECK(c.num_experts > 0 && c.num_experts <= 1024, source, ": num_experts ", c.num_experts,
             " must be in 1..1024");
  KVPR_CHECK(c.experts_per_token > 0 && c.experts_per_token <= c.num_experts, source, ": num_experts_per_tok ",
             c.experts_per_token, " must be in 1..num_experts (", c.num_experts, ")");
  KVPR_CHECK(c.moe_intermediate_size > 0 && c.decoder_sparse_step > 0 && c.shared_expert_intermediate_size >= 0,
             source, ": moe_intermediate_size and decoder_sparse_step must be positive");
}

void LlamaConfig::set_yarn(double factor, double original, double beta_fast, double beta_slow, double attention_factor,
                           double mscale, double mscale_all_dim, bool truncate, const std::string& source) {
  // transformers takes `beta_fast or 32`, `beta_slow or 1`: a zero is the default too.
  if (beta_fast == 0) beta_fast = 32;
  if (beta_slow == 0) beta_slow = 1;
  KVPR_CHECK(original > 0 && beta_fast > 0 && beta_slow > 0, source,
             ": yarn rope scaling needs positive original_max_position_embeddings, beta_fast and beta_slow");
  // The element pair whose wavelength turns `rotations` times over the original context:
  // dim * ln(original / (2 pi rotations)) / (2 ln theta), in pairs of dim = the rotary part.
  const double dim = static_cast<double>(rope_dim());
  auto correction_dim = [&](double rotations) {
    return dim * std::log(original / (rotations * 2 * M_PI)) / (2 * std::log(rope_theta));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (truncate) low = std::floor(low), high = std::ceil(high);
  rope_yarn_factor = factor;
  rope_yarn_low = std::max(low, 0.0);
  rope_yarn_high = std::min(high, dim - 1);
  auto yarn_mscale = [&](double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
  rope_attention_factor = attention_factor > 0                    ? attention_factor
                          : mscale != 0 && mscale_all_dim != 0 ? yarn_mscale(mscale) / yarn_mscale(mscale_all_dim)
                                                                 : yarn_mscale(1.0);
  rope_yarn_context = static_cast<int64_t>(std::llround(factor * original));
}

void LlamaConfig::set_longrope(const std::string& source) {
  const size_t pairs = static_cast<size_t>(rope_dim() / 2);
  KVPR_CHECK(longrope_short.size() == pairs && longrope_long.size() == pairs, source, ": longrope needs ", pairs,
             " short and long factors (rotary dimensions / 2), not ", longrope_short.size(), " and ",
             longrope_long.size());
  KVPR_CHECK(pairs <= static_cast<size_t>(kLongropeMaxPairs), source, ": longrope over ", pairs,
             " rotary pairs is not supported (at most ", kLongropeMaxPairs, ")");
  if (longrope_original <= 0) longrope_original = max_position_embeddings;
  if (rope_attention_factor <= 0) {
    const double factor = static_cast<double>(max_position_embeddings) / static_cast<double>(longrope_original);
    rope_attention_factor =
        factor <= 1 ? 1.0 : std::sqrt(1 + std::log(factor) / std::log(static_cast<double>(longrope_original)));
  }
}

RopeParams LlamaConfig::rope_params(int64_t layer) const {
  if (local_rope_theta > 0 && sliding(layer)) {  // Gemma 3's local layers: their base, no scaling
    RopeParams r;
    r.theta = static_cast<float>(local_rope_theta);
    if (rope_dim() < head_dim()) r.rotary_dim = static_cast<int>(rope_dim());
    return r;
  }
  return rope_params();
}

RopeParams LlamaConfig::rope_params() const {
  RopeParams r;
  r.theta = static_cast<float>(rope_theta);
  r.freq_scale = static_cast<float>(rope_freq_scale);
  r.llama3_factor = static_cast<float>(rope_llama3_factor);
  r.low_freq_factor = static_cast<float>(rope_low_freq_factor);
  r.high_freq_factor = static_cast<float>(rope_high_freq_factor);
  r.original_max_position = static_cast<float>(rope_original_max_position);
  r.yarn_factor = static_cast<float>(rope_yarn_factor);
  r.yarn_low = static_cast<float>(rope_yarn_low);
  r.yarn_high = static_cast<float>(rope_yarn_high);
  r.attention_scale = static_cast<float>(rope_attention_factor);
  if (rope_dim() < head_dim()) r.rotary_dim = static_cast<int>(rope_dim());
  r.longrope_pairs = static_cast<int>(longrope_short.size());
  for (size_t i = 0; i < longrope_short.size(); ++i) {
    r.longrope[0][i] = static_cast<float>(longrope_short[i]);
    r.longrope[1][i] = static_cast<float>(longrope_long[i]);
  }
  return r;
}

LlamaConfig LlamaConfig::load(const std::string& model_dir) {
  return from_json(read_config_json(model_dir), "config.json");
}

ModelSpec LlamaConfig::spec() const {
  ModelSpec s;
  s.model_type = model_type;
  s.vocab_size = vocab_size;
  s.hidden_size = hidden_size;
  s.num_layers = num_layers;
  s.num_heads = num_heads;
  s.num_kv_heads = num_kv_heads;
  s.head_dim = head_dim();
  s.ffn_dim = intermediate_size;
  s.max_position_embeddings = context();
  // A sequence past the original context turns by the long factors (all of it: see Generator).
  if (longrope_original < max_position_embeddings && !longrope_short.empty()) s.long_rope_after = longrope_original;
  s.bos_token_id = bos_token_id;
  s.eos_token_id = eos_token_id;
  s.pad_token_id = pad_token_id;
  s.torch_dtype = torch_dtype;
  if (sliding_window > 0)
    for (int64_t i = 0; i < num_layers; ++i) s.windows.push_back(window(i));
  return s;
}

}  // namespace kvpr

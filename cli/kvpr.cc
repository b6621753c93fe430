// kvpr: the command-line front end of the engine.
//   kvpr generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3 | --chat TEXT) [options]
//   kvpr tokenize --model DIR --text TEXT [--json]
//   kvpr info --model DIR [--json]
//   kvpr make-demo-model --out DIR [--tokenizer-dir DIR]
// Errors: exit code 1 (2 for usage) and one line on stderr.
#include <charconv>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "openai/chat_template.h"
#include "openai/model_chat_template.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/model/demo_model.h"
#include "engine/base/error.h"
#include "engine/decode/engine_options.h"
#include "engine/decode/generator.h"
#include "engine/base/json.h"
#include "engine/constrain/json_schema.h"
#include "engine/base/npy.h"
#include "engine/model/llama_model.h"
#include "engine/model/opt_model.h"
#include "engine/kv/profiler.h"
#include "engine/text/tokenizer.h"
#ifdef KVPR_HAVE_HWLOC
#include "numa/placement.h"
#endif

namespace {

using namespace kvpr;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* kUsage =
    "usage: kvpr <command> [options]\n"
    "\n"
    "commands:\n"
    "  generate         --model DIR (--prompt TEXT | --prompt-ids 1,2,3 | --chat TEXT [--system TEXT]\n"
    "                   [--chat-template auto|plain|llama-2|mistral|mistral-nemo|zephyr|chatml|qwen2|qwen2.5|qwen3|\n"
    "                   llama-3|llama-3.1|llama-3.2] [--no-thinking])\n"
    "                   [-n N]\n"
    "                   [--temperature T] [--top-k K] [--top-p P] [--min-p M] [--seed S] [--stop STR]...\n"
    "                   [--repetition-penalty R] [--presence-penalty P] [--frequency-penalty F] [--top-logprobs K]\n"
    "                   [--prompt-logprobs K] [--ignore-eos] [--response-format text|json_object]\n"
    "                   [--json-schema FILE] [--json-whitespace compact|permissive]\n"
    "                   [--backend auto|cpu|cuda] [--kv-dtype f32|f16|bf16|fp8]\n"
    "                   [--kv-mode resident|offload|kvpr|recompute|cpu-attn] [--split L]\n"
    "                   [--activation-cap N] [--profile FILE] [--split-model pipeline|paper]\n"
    "                   [--host-attention-threads N] [--emulate-link-gbps G] [--trace FILE.json]\n"
    "                   [--weights device|host] [--cuda-graphs] [--json] [--dump-logits FILE.npy]\n"
    "                   and the other engine options kvprd --help lists (--speculative-tokens N,\n"
    "                   --max-seq-len L, --prefix-caching=on|off, ...)\n"
    "  profile          --model DIR [--backend B] [--kv-dtype D] [--emulate-link-gbps G]\n"
    "                   [--save FILE] [--json] [--quick]\n"
    "  topology         [--json] [--xml FILE] [--gpus BUSID,...] [--workers N]\n"
    "  tokenize         --model DIR --text TEXT [--json]\n"
    "  info             --model DIR [--json]\n"
    "  make-demo-model  --out DIR [--tokenizer-dir DIR]\n"
    "\n"
    "Temperature 0 (the default) is greedy decoding. --prompt-ids uses the ids as given (no BOS).\n";

// Flags of one command: --name value, --flag, repeated values kept in order; a switch is on
// alone (--cuda-graphs) or takes its value after '=' (--prefix-caching=off).
class Args {
 public:
  Args(int argc, char** argv, int start, const std::vector<std::string>& valued,
       const std::vector<std::string>& flags, const std::vector<std::string>& switches = {}) {
    for (int i = start; i < argc; ++i) {
      std::string a = argv[i];
      std::string name = a, value;
      bool has_value = false;
      if (size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
        name = a.substr(0, eq);
        value = a.substr(eq + 1);
        has_value = true;
      }
      if (std::find(flags.begin(), flags.end(), name) != flags.end()) {
        if (has_value) throw UsageError(name + " takes no value");
        values_[name].push_back("1");
      } else if (std::find(switches.begin(), switches.end(), name) != switches.end()) {
        values_[name].push_back(has_value ? value : "on");
      } else if (std::find(valued.begin(), valued.end(), name) != valued.end()) {
        if (!has_value) {
          if (i + 1 >= argc) throw UsageError(name + " needs a value");
          value = argv[++i];
        }
        values_[name].push_back(value);
      } else {
        throw UsageError("unknown option '" + a + "'");
      }
    }
  }
  bool has(const std::string& n) const { return values_.count(n) > 0; }
  std::string get(const std::string& n, const std::string& def = "") const {
    auto it = values_.find(n);
    return it == values_.end() ? def : it->second.back();
  }
  std::vector<std::string> all(const std::string& n) const {
    auto it = values_.find(n);
    return it == values_.end() ? std::vector<std::string>{} : it->second;
  }
  std::string require(const std::string& n) const {
    if (!has(n)) throw UsageError("missing required option " + n);
    return get(n);
  }

 private:
  std::map<std::string, std::vector<std::string>> values_;
};

template <typename T>
T parse_number(const std::string& flag, const std::string& s) {
  T v{};
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size())
    throw UsageError(flag + ": '" + s + "' is not a valid number");
  return v;
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    while (!tok.empty() && tok.front() == ' ') tok.erase(tok.begin());
    while (!tok.empty() && tok.back() == ' ') tok.pop_back();
    if (tok.empty()) throw UsageError("--prompt-ids: empty id in '" + s + "'");
    ids.push_back(parse_number<int32_t>("--prompt-ids", tok));
    i = j + 1;
  }
  return ids;
}

json::Value ids_json(const std::vector<int32_t>& ids) {
  json::Array a;
  for (int32_t t : ids) a.emplace_back(static_cast<int64_t>(t));
  return json::Value(std::move(a));
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return buf;
}

// --emulate-link-gbps: pace the CPU backend's copy engines like a link of that speed.
void apply_emulated_link(Backend& be, const Args& a) {
  if (!a.has("--emulate-link-gbps")) return;
  double g = parse_number<double>("--emulate-link-gbps", a.get("--emulate-link-gbps"));
  if (!(g > 0)) throw UsageError("--emulate-link-gbps must be > 0");
  auto* cpu = dynamic_cast<CpuBackend*>(&be);
  if (!cpu) throw UsageError("--emulate-link-gbps is for the cpu backend");
  cpu->set_emulated_link_gbps(g);
}

// The engine's options (engine/decode/engine_options.h) as a command's flags: `own` with them
// all (each takes a value; a switch may stand alone), for Args.
std::vector<std::string> with_engine_flags(std::vector<std::string> own, bool switches) {
  for (const auto& o : engine_options())
    if (o.is_switch == switches) own.push_back(std::string("--") + o.name);
  return own;
}

// The engine's options the command line gives, over `o`, checked together; a bad one is a
// usage error (exit 2).
EngineOptions engine_flags(const Args& a, EngineOptions o = {}) {
  try {
    for (const auto& opt : engine_options())
      if (a.has(std::string("--") + opt.name)) opt.set(o, a.get(std::string("--") + opt.name));
    validate(o);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  return o;
}

LinkProfile run_profiler(Backend& be, Model& model, DType dtype, bool quick) {
  const ProfileOptions po = quick ? ProfileOptions::quick() : ProfileOptions{};
  return profile_backend(be, model, model.kv_shape(), dtype, po);
}

// generate's sampling and output flags.
GenerationParams generation_params(const Args& a) {
  GenerationParams gp;
  gp.max_new_tokens = parse_number<int>("-n", a.get("-n", a.get("--max-tokens", "16")));
  if (gp.max_new_tokens < 0) throw UsageError("-n must be >= 0");
  gp.sampling.temperature = parse_number<float>("--temperature", a.get("--temperature", "0"));
  gp.sampling.top_k = parse_number<int>("--top-k", a.get("--top-k", "0"));
  gp.sampling.top_p = parse_number<float>("--top-p", a.get("--top-p", "1"));
  gp.sampling.min_p = parse_number<float>("--min-p", a.get("--min-p", "0"));
  if (a.has("--seed")) gp.sampling.seed = parse_number<uint64_t>("--seed", a.get("--seed"));
  gp.stop = a.all("--stop");
  gp.ignore_eos = a.has("--ignore-eos");
  const std::string format = a.get("--response-format", "text");
  if (format != "text" && format != "json_object")
    throw UsageError("--response-format: expected text or json_object, got '" + format + "'");
  gp.json_object = format == "json_object";
  if (a.has("--json-schema")) {  // the text valid against a JSON Schema (engine/constrain/json_schema.h)
    if (format != "text") throw UsageError("give --response-format or --json-schema, not both");
    gp.json_schema = json::parse_file(a.get("--json-schema"));  // compiled (or refused) by the engine
  }
  gp.sampling.repetition_penalty = parse_number<float>("--repetition-penalty", a.get("--repetition-penalty", "1"));
  gp.sampling.presence_penalty = parse_number<float>("--presence-penalty", a.get("--presence-penalty", "0"));
  gp.sampling.frequency_penalty = parse_number<float>("--frequency-penalty", a.get("--frequency-penalty", "0"));
  gp.top_logprobs = parse_number<int>("--top-logprobs", a.get("--top-logprobs", "0"));
  gp.prompt_logprobs = parse_number<int>("--prompt-logprobs", a.get("--prompt-logprobs", "-1"));
  validate(gp.sampling);
  return gp;
}

// generate's prompt: the text, the ids, or one user turn (after an optional system message) in
// the model's chat template, as kvprd renders /v1/chat/completions, whose stop strings and
// tokens then apply.
std::vector<int32_t> prompt_of(const Args& a, const std::string& dir, const Tokenizer& tok, GenerationParams& gp) {
  if (!a.has("--chat")) return a.has("--prompt") ? tok.encode(a.get("--prompt")) : parse_ids(a.get("--prompt-ids"));
  const std::string choice = a.get("--chat-template", "auto");
  if (choice != "auto" && !is_chat_template_file(choice) && !known_chat_template(choice))
    throw UsageError("--chat-template: unknown template '" + choice + "'");
  const ChatTemplateChoice ct = choose_chat_template(dir, choice);
  ChatOptions co;
  co.default_system = ct.default_system;
  std::vector<ChatMessage> messages;
  if (a.has("--system")) messages.push_back({"system", a.get("--system")});
  messages.push_back({"user", a.get("--chat")});
  co.enable_thinking = !a.has("--no-thinking");
  if (a.has("--no-thinking")) co.template_kwargs.emplace_back("enable_thinking", false);
  const RenderedChat rc = ct.model ? ct.model->render(messages, co) : render_chat(ct.family, messages, co);
  gp.stop.insert(gp.stop.end(), rc.stop.begin(), rc.stop.end());
  for (const auto& t : rc.stop_tokens)
    if (auto tid = tok.token_to_id(t)) gp.stop_token_ids.push_back(*tid);
  return tok.encode(rc.prompt, rc.add_special_tokens);
}

// One step of generate --json: the split, the bytes moved, graphs and drafts.
json::Value step_json(Generator& gen, const EngineOptions& eo, const SpeculationStats& before) {
  const StepStats& st = gen.kv_runtime().last_step();
  json::Value o(json::Object{});
  o.set("split", json::Array(st.split.begin(), st.split.end()));
  o.set("split_layer0", st.split_total_layer0);
  o.set("split_source", st.split_source);
  o.set("h2d_bytes", st.h2d_bytes);
  o.set("d2h_bytes", st.d2h_bytes);
  if (eo.weights_on_host) o.set("weight_h2d_bytes", st.weight_h2d_bytes);
  if (gen.kv_runtime().device_tier()) {  // auto: the tiers of the step's cached tokens
    o.set("resident_tokens", st.resident_tokens);
    o.set("staged_tokens", st.staged_tokens);
    o.set("promoted_blocks", st.promoted_blocks);
  }
  if (eo.generator.cuda_graphs) o.set("graph", graph_outcome_name(gen.last_graph_step().outcome));
  if (eo.generator.speculative_tokens > 0) {  // this step's drafts: checked, taken
    o.set("drafts", gen.speculation_stats().proposed - before.proposed);
    o.set("accepted", gen.speculation_stats().accepted - before.accepted);
  }
  if (st.split_source.rfind("scheduler", 0) == 0) {
    o.set("predicted_layer_ms", st.predicted_layer_ms);
    o.set("link_gbps_estimate", st.link_gbps_estimate);
  }
  return o;
}

// generate --json's answer.
json::Value result_json(const SequenceResult& r, const GenerationParams& gp, const Generator& gen, const EngineOptions& eo,
                        const Backend& backend, json::Array steps) {
  auto floats = [](const std::vector<float>& v) { return json::Array(v.begin(), v.end()); };
  auto pairs = [](const std::vector<std::vector<TokenLogprob>>& rows) {
    json::Array out;
    for (const auto& row : rows) out.push_back(logprob_pairs_json(row));
    return out;
  };
  json::Value o(json::Object{});
  o.set("tokens", ids_json(r.tokens));
  o.set("text", r.text);
  o.set("prompt_tokens", static_cast<int64_t>(r.prompt.size()));
  o.set("prompt_ids", ids_json(r.prompt));
  o.set("finish_reason", finish_reason_name(r.finish));
  o.set("logprobs", floats(r.logprobs));
  if (gp.top_logprobs > 0) o.set("top_logprobs", pairs(r.top));
  if (gp.prompt_logprobs >= 0) {
    o.set("prompt_logprobs", floats(r.prompt_logprobs));
    if (gp.prompt_logprobs > 0) o.set("prompt_top_logprobs", pairs(r.prompt_top));
  }
  o.set("backend", backend.name());
  o.set("kv_mode", kv_mode_name(eo.generator.kv.mode));
  o.set("weights", eo.weights_on_host ? "host" : "device");
  if (eo.generator.speculative_tokens > 0)
    o.set("speculation", json::Object{{"proposed", gen.speculation_stats().proposed},
                                      {"accepted", gen.speculation_stats().accepted}});
  o.set("steps", std::move(steps));
  return o;
}

int cmd_generate(int argc, char** argv) {
  Args a(argc, argv, 2,
         with_engine_flags({"--model", "--prompt", "--prompt-ids", "-n", "--max-tokens", "--temperature", "--top-k",
                            "--top-p", "--min-p", "--seed", "--stop", "--backend", "--dump-logits", "--emulate-link-gbps",
                            "--trace", "--repetition-penalty", "--presence-penalty", "--frequency-penalty",
                            "--top-logprobs", "--prompt-logprobs", "--chat", "--system", "--chat-template",
                            "--response-format", "--json-schema"},
                           false),
         {"--json", "--ignore-eos", "--no-thinking"}, with_engine_flags({}, true));
  const std::string dir = a.require("--model");
  if (a.has("--prompt") + a.has("--prompt-ids") + a.has("--chat") != 1)
    throw UsageError("give exactly one of --prompt, --prompt-ids and --chat");
  if ((a.has("--system") || a.has("--chat-template") || a.has("--no-thinking")) && !a.has("--chat"))
    throw UsageError("--system, --chat-template and --no-thinking apply to --chat");
  GenerationParams gp = generation_params(a);
  EngineOptions one;
  one.generator.max_batch = 1;
  const EngineOptions eo = engine_flags(a, one);

  auto backend = create_backend(a.get("--backend", "auto"));
  apply_emulated_link(*backend, a);
  Tracer tracer;
  if (a.has("--trace")) backend->set_tracer(&tracer);
  ModelLoadOptions lo;
  lo.stream_weights = eo.weights_on_host;
  lo.verify_weights = eo.verify_weights;
  lo.kv_plan = [&eo](const ModelSpec& spec, DType weight_dtype, const Backend& b, double host_weights) {
    return Generator::kv_plan(eo.generator, spec, weight_dtype, &b, host_weights);
  };
  std::unique_ptr<Model> model = load_model(*backend, dir, lo);
  const Tokenizer tok = Tokenizer::load(dir);
  const std::vector<int32_t> prompt = prompt_of(a, dir, tok, gp);
  GeneratorOptions go = eo.generator;
  if (kv_mode_splits(go.kv.mode) && !go.kv.forced_split) {
    if (!eo.profile.empty()) {
      go.kv.profile = LinkProfile::load(eo.profile);
    } else {
      std::fprintf(stderr, "kvpr: profiling the link and the recompute GEMM (save one with kvpr profile --save)\n");
      go.kv.profile = run_profiler(*backend, *model, go.kv_dtype.value_or(model->weight_dtype()), true);
    }
  }
  Generator gen(*model, tok, go);
  std::vector<float> dumped;
  Generator::LogitsObserver obs;
  const int64_t V = model->spec().vocab_size;
  if (a.has("--dump-logits"))
    obs = [&](uint64_t, const float* row, int64_t) { dumped.insert(dumped.end(), row, row + V); };
  const uint64_t id = gen.add(prompt, gp);
  json::Array steps;
  while (!gen.idle()) {
    const SpeculationStats before = gen.speculation_stats();
    gen.step(obs);
    steps.push_back(step_json(gen, eo, before));
  }
  const SequenceResult r = gen.take_result(id);
  if (a.has("--trace")) {
    backend->synchronize();
    tracer.write(a.get("--trace"));
  }
  if (a.has("--dump-logits")) write_npy_f32(a.get("--dump-logits"), dumped.data(), {static_cast<int64_t>(dumped.size()) / V, V});
  if (a.has("--json")) {
    json::Value out = result_json(r, gp, gen, eo, *backend, std::move(steps));
    if (eo.verify_weights) out.set("weights_digest", model->weights_digest());
    std::cout << out.dump() << "\n";
  }
  else std::cout << r.text << "\n";
  return 0;
}

int cmd_tokenize(int argc, char** argv) {
  Args a(argc, argv, 2, {"--model", "--text"}, {"--json"});
  Tokenizer tok = Tokenizer::load(a.require("--model"));
  std::vector<int32_t> ids = tok.encode(a.require("--text"));
  if (a.has("--json")) {
    json::Value o(json::Object{});
    o.set("ids", ids_json(ids));
    json::Array toks;
    for (int32_t t : ids) toks.emplace_back(tok.id_to_token(t));
    o.set("tokens", std::move(toks));
    std::cout << o.dump() << "\n";
  } else {
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
  }
  return 0;
}

// "no", "linear x2", "llama3 x8 (1-4, 8192)", "yarn x4 (pairs 23-40, attention x1.139)",
// "longrope (48 pairs, long past 4096, attention x1.19)": the rotary scaling a Llama config asks for.
std::string rope_scaling_text(const LlamaConfig& c) {
  char buf[96];
  if (!c.longrope_short.empty())
    std::snprintf(buf, sizeof buf, "longrope (%zu pairs, long past %lld, attention x%.4g)", c.longrope_short.size(),
                  static_cast<long long>(c.longrope_original), c.rope_attention_factor);
  else if (c.rope_yarn_factor > 0)
    std::snprintf(buf, sizeof buf, "yarn x%g (pairs %g-%g, attention x%.4g)", c.rope_yarn_factor, c.rope_yarn_low,
                  c.rope_yarn_high, c.rope_attention_factor);
  else if (c.rope_llama3_factor > 0)
    std::snprintf(buf, sizeof buf, "llama3 x%g (%g-%g, %g)", c.rope_llama3_factor, c.rope_low_freq_factor,
                  c.rope_high_freq_factor, c.rope_original_max_position);
  else if (c.rope_freq_scale != 1.0)
    std::snprintf(buf, sizeof buf, "linear x%g", 1.0 / c.rope_freq_scale);
  else
    return "no";
  return buf;
}

// The gated MLP by its activation: SwiGLU, GeGLU (Gemma's), gpt-oss's clamped SwiGLU.
const char* mlp_text(const LlamaConfig& c) {
  switch (c.mlp_activation) {
    case Activation::GELU:
    case Activation::GELUTanh: return "GeGLU";
    case Activation::ClampedSwiGLU: return "clamped SwiGLU";
    default: return "SwiGLU";
  }
}

// The per-layer attention beyond full causal softmax: "sliding window 1024 on 5 of 6 layers,
// scores soft-capped at 50, sink logits"; "" when there is none.
std::string attention_text(const LlamaConfig& c) {
  std::string out;
  auto add = [&](const std::string& s) { out += (out.empty() ? "" : ", ") + s; };
  int64_t sliding = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) sliding += c.sliding(i);
  if (sliding > 0)
    add("sliding window " + std::to_string(c.sliding_window) + " on " + std::to_string(sliding) + " of " +
        std::to_string(c.num_layers) + " layers" + (c.local_rope_theta > 0 ? " (their own rope)" : ""));
  char buf[64];
  if (c.attn_softcap > 0) std::snprintf(buf, sizeof buf, "scores soft-capped at %g", c.attn_softcap), add(buf);
  if (c.query_pre_attn_scalar > 0) std::snprintf(buf, sizeof buf, "scaled by %g^-1/2", c.query_pre_attn_scalar), add(buf);
  if (c.attention_sinks) add("sink logits");
  if (c.rope_dim() < c.head_dim()) add("rotary on " + std::to_string(c.rope_dim()) + " of " + std::to_string(c.head_dim()));
  if (c.final_softcap > 0) std::snprintf(buf, sizeof buf, "logits soft-capped at %g", c.final_softcap), add(buf);
  return out;
}

// What kvpr info reports of a model, loaded as --weights host would load it (to report what
// the device holds either way).
struct ModelInfo {
  ModelInfo(std::unique_ptr<Model> loaded, const std::string& dir);
  json::Value to_json() const;
  void print() const;

  std::unique_ptr<Model> owned;
  const Model& model;
  const ModelSpec& c;
  const OptModel* opt;
  const LlamaModel* llama;
  const char* arch;
  const LayerWeightStream* ws;
  std::optional<Tokenizer> tok;  // none when the model has no tokenizer files
  int64_t kv_per_token, act_per_token;
};

ModelInfo::ModelInfo(std::unique_ptr<Model> loaded, const std::string& dir)
    : owned(std::move(loaded)),
      model(*owned),
      c(model.spec()),
      opt(dynamic_cast<const OptModel*>(&model)),
      llama(dynamic_cast<const LlamaModel*>(&model)),
      arch(opt ? "OPTForCausalLM" : llama->config().architecture()),
      ws(model.weight_stream()),
      kv_per_token(2 * c.num_layers * c.kv_hidden() * static_cast<int64_t>(dtype_size(model.weight_dtype()))),
      act_per_token(c.num_layers * c.hidden_size * static_cast<int64_t>(dtype_size(model.weight_dtype()))) {
  try {
    tok = Tokenizer::load(dir);
  } catch (const Error&) {
    // A model without tokenizer files still has an architecture to report.
  }
}

json::Value ModelInfo::to_json() const {
  json::Value o(json::Object{});
  o.set("architecture", arch);
  o.set("model_type", c.model_type);
  o.set("layers", c.num_layers);
  o.set("hidden_size", c.hidden_size);
  o.set("heads", c.num_heads);
  o.set("kv_heads", c.num_kv_heads);
  o.set("head_dim", c.head_dim);
  o.set("ffn_dim", c.ffn_dim);
  o.set("vocab_size", c.vocab_size);
  o.set("max_position_embeddings", c.max_position_embeddings);
  if (opt) {
    o.set("word_embed_proj_dim", opt->config().word_embed_proj_dim);
    o.set("layer_norm", opt->config().do_layer_norm_before ? "pre" : "post");
  }
  if (llama) {
    o.set("rope_theta", llama->config().rope_theta);
    o.set("rope_scaling", rope_scaling_text(llama->config()));
    o.set("rms_norm_eps", llama->config().rms_norm_eps);
    o.set("tie_word_embeddings", llama->config().tie_word_embeddings);
    o.set("q_width", llama->config().q_width());
    o.set("qk_norm", llama->config().qk_norm);
    o.set("attention_biases", llama->config().o_bias ? "qkvo" : llama->config().qkv_bias ? "qkv" : "none");
    o.set("mlp", mlp_text(llama->config()));
    o.set("attention", attention_text(llama->config()));
    json::Array windows;
    for (int64_t w : c.windows) windows.push_back(w);
    o.set("sliding_windows", std::move(windows));  // per layer (0: full); empty when none slides
  }
  o.set("checkpoint_format", model.checkpoint_format());
  o.set("weight_dtype", dtype_name(model.weight_dtype()));
  o.set("quantization", model.quantization().to_json(model.kept_quantized(), model.dequantized_dtype()));
  o.set("parameters", model.parameter_count());
  if (llama && llama->config().moe()) {
    const LlamaConfig& lc = llama->config();
    json::Value ex(json::Object{});
    ex.set("experts", lc.num_experts);
    ex.set("per_token", lc.experts_per_token);
    ex.set("width", lc.moe_intermediate_size);
    ex.set("moe_layers", lc.moe_layers());
    ex.set("shared_expert_width", lc.shared_expert_intermediate_size);
    ex.set("norm_topk_prob", lc.norm_topk_prob);
    o.set("mixture_of_experts", std::move(ex));
    o.set("active_parameters", model.parameter_count() - lc.idle_expert_parameters());
  }
  o.set("weight_bytes", static_cast<int64_t>(model.weight_bytes()));
  json::Value dw(json::Object{});
  dw.set("device", static_cast<int64_t>(model.weight_bytes()));
  dw.set("host", static_cast<int64_t>(model.device_weight_bytes()));
  o.set("device_weight_bytes", std::move(dw));
  o.set("streamed_layer_bytes", static_cast<int64_t>(ws->max_layer_bytes()));
  o.set("kv_bytes_per_token", kv_per_token);
  o.set("activation_bytes_per_token", act_per_token);
  if (tok) o.set("tokenizer_size", static_cast<int64_t>(tok->size()));
  json::Value hb(json::Object{});
  for (KvMode m : kAllKvModes)
    hb.set(kv_mode_name(m), KvRuntime::host_bytes_per_token(m, model.kv_shape(), model.weight_dtype()));
  o.set("host_bytes_per_token", std::move(hb));
  return o;
}

void ModelInfo::print() const {
  if (opt)
    std::printf("architecture          %s (%s-LN%s)\n", arch, opt->config().do_layer_norm_before ? "pre" : "post",
                opt->config().has_projection() ? ", projected embeddings" : "");
  else
    std::printf("architecture          %s (RMSNorm%s, rotary theta %g, %s rope scaling,%s %s)\n", arch,
                llama->config().gemma_norms ? " (1 + w), output norms, scaled embeddings" : "",
                llama->config().rope_theta, rope_scaling_text(llama->config()).c_str(),
                llama->config().qk_norm ? " per-head Q/K norms," : "", mlp_text(llama->config()));
  if (llama && !attention_text(llama->config()).empty())
    std::printf("attention             %s\n", attention_text(llama->config()).c_str());
  std::printf("layers                %lld\n", static_cast<long long>(c.num_layers));
  std::printf("hidden / heads        %lld / %lld (head dim %lld%s)\n", static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.num_heads), static_cast<long long>(c.head_dim),
              c.q_width() != c.hidden_size ? (", Q " + std::to_string(c.q_width()) + " wide").c_str() : "");
  std::printf("ffn                   %lld\n", static_cast<long long>(c.ffn_dim));
  std::printf("vocab                 %lld%s\n", static_cast<long long>(c.vocab_size),
              tok ? (" (tokenizer " + std::to_string(tok->size()) + ")").c_str() : "");
  if (llama && llama->config().context() > llama->config().max_position_embeddings)
    std::printf("context               %lld (yarn x%g; max_position_embeddings %lld)\n",
                static_cast<long long>(c.max_position_embeddings), llama->config().rope_yarn_factor,
                static_cast<long long>(llama->config().max_position_embeddings));
  else
    std::printf("context               %lld\n", static_cast<long long>(c.max_position_embeddings));
  std::printf("checkpoint            %s, %s\n", model.checkpoint_format().c_str(), dtype_name(model.weight_dtype()));
  if (const QuantizedCheckpoint& q = model.quantization(); !q.method().empty())
    std::printf("quantization          %s, %.2f bits a weight as stored, %s\n", q.describe().c_str(),
                q.bits_per_weight(), q.how_computed(model.kept_quantized(), model.dequantized_dtype()).c_str());
  if (llama && llama->config().moe()) {
    const LlamaConfig& lc = llama->config();
    std::printf("experts               %lld of width %lld, %lld per token%s, in %lld of %lld layers%s\n",
                static_cast<long long>(lc.num_experts), static_cast<long long>(lc.moe_intermediate_size),
                static_cast<long long>(lc.experts_per_token), lc.norm_topk_prob ? " (weights renormalised)" : "",
                static_cast<long long>(lc.moe_layers()), static_cast<long long>(lc.num_layers),
                lc.shared_expert_intermediate_size > 0
                    ? (", a shared expert of width " + std::to_string(lc.shared_expert_intermediate_size)).c_str()
                    : "");
  }
  std::printf("parameters            %lld (%.1fM)\n", static_cast<long long>(model.parameter_count()),
              model.parameter_count() / 1e6);
  if (llama && llama->config().moe()) {
    const int64_t active = model.parameter_count() - llama->config().idle_expert_parameters();
    std::printf("active parameters     %lld (%.1fM: what one token runs through)\n", static_cast<long long>(active),
                active / 1e6);
  }
  std::printf("weight bytes          %s\n", human_bytes(static_cast<double>(model.weight_bytes())).c_str());
  std::printf("on the device         %s with --weights device; %s with --weights host (2 layer slots of %s)\n",
              human_bytes(static_cast<double>(model.weight_bytes())).c_str(),
              human_bytes(static_cast<double>(model.device_weight_bytes())).c_str(),
              human_bytes(static_cast<double>(ws->max_layer_bytes())).c_str());
  std::printf("KV bytes / token      %s (K and V, all layers, %s)\n", human_bytes(kv_per_token).c_str(),
              dtype_name(model.weight_dtype()));
  std::printf("activation bytes / token  %s (layer inputs X, all layers)\n", human_bytes(act_per_token).c_str());
  std::printf("host bytes / token by --kv-mode:");
  for (KvMode m : kAllKvModes)
    std::printf("  %s %s", kv_mode_name(m),
                human_bytes(static_cast<double>(KvRuntime::host_bytes_per_token(m, model.kv_shape(), model.weight_dtype())))
                    .c_str());
  std::printf("\n");
}

int cmd_info(int argc, char** argv) {
  Args a(argc, argv, 2, {"--model", "--backend"}, {"--json"});
  const std::string dir = a.require("--model");
  auto backend = create_backend(a.get("--backend", "cpu"));
  ModelLoadOptions lo;
  lo.stream_weights = true;
  const ModelInfo info(load_model(*backend, dir, lo), dir);
  if (a.has("--json")) std::cout << info.to_json().dump() << "\n";
  else info.print();
  return 0;
}

int cmd_profile(int argc, char** argv) {
  Args a(argc, argv, 2, {"--model", "--backend", "--kv-dtype", "--emulate-link-gbps", "--save"}, {"--json", "--quick"});
  std::string dir = a.require("--model");
  auto backend = create_backend(a.get("--backend", "auto"));
  apply_emulated_link(*backend, a);
  std::unique_ptr<Model> loaded = load_model(*backend, dir);
  Model& model = *loaded;
  DType dt = engine_flags(a).generator.kv_dtype.value_or(model.weight_dtype());
  LinkProfile p = run_profiler(*backend, model, dt, a.has("--quick"));
  if (a.has("--save")) p.save(a.get("--save"));
  if (a.has("--json")) {
    std::cout << p.to_json().dump() << "\n";
    return 0;
  }
  std::printf("device                    %s\n", p.device.c_str());
  std::printf("H2D pinned, alone         %8.2f GB/s\n", p.h2d_alone_gbps);
  std::printf("H2D pinned, D2H running   %8.2f GB/s   (used by the scheduler)\n", p.h2d_gbps);
  std::printf("D2H pinned                %8.2f GB/s\n", p.d2h_gbps);
  std::printf("recompute K,V (h=%lld, %s X): %.3f us fixed + %.4f us per token\n", static_cast<long long>(p.hidden),
              dtype_name(dt), p.recompute_fixed_s * 1e6, p.recompute_per_row_s * 1e6);
  for (const auto& pt : p.gemm_points.as_array())
    std::printf("  l = %-6lld %10.3f ms\n", static_cast<long long>(pt.find("rows")->as_int()),
                pt.find("seconds")->as_double() * 1e3);
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  const double kv_tok = 2.0 * model.spec().kv_hidden() * es, x_tok = model.spec().hidden_size * es;
  std::printf("per token and layer: moving K+V %.3f us, moving X %.3f us, recomputing %.3f us\n",
              kv_tok / (p.h2d_gbps * 1e9) * 1e6, x_tok / (p.h2d_gbps * 1e9) * 1e6, p.recompute_per_row_s * 1e6);
  if (a.has("--save")) std::printf("saved to %s\n", a.get("--save").c_str());
  return 0;
}

int cmd_topology(int argc, char** argv) {
  Args a(argc, argv, 2, {"--xml", "--gpus", "--workers"}, {"--json"});
#ifdef KVPR_HAVE_HWLOC
  Topology topo = a.has("--xml") ? Topology::from_xml(a.get("--xml")) : Topology::from_system();
  std::vector<std::string> bus;
  if (a.has("--gpus")) {
    std::string list = a.get("--gpus");
    for (size_t p = 0; p <= list.size();) {
      size_t q = list.find(',', p);
      if (q == std::string::npos) q = list.size();
      if (q > p) bus.push_back(list.substr(p, q - p));
      p = q + 1;
    }
  } else if (!a.has("--xml")) {
    bus = cuda_pci_bus_ids();
  } else {
    for (const auto& g : topo.gpus()) bus.push_back(g.bus_id);
  }
  int workers = parse_number<int>("--workers", a.get("--workers", "1"));
  auto plan = plan_placement(topo, bus, bus.empty() ? workers : 0);
  if (a.has("--json")) std::cout << placement_json(topo, plan).dump() << "\n";
  else std::cout << placement_table(topo, plan);
  return 0;
#else
  (void)a;
  KVPR_THROW("this build has no hwloc (install libhwloc-dev and rebuild)");
#endif
}

int cmd_make_demo(int argc, char** argv) {
  Args a(argc, argv, 2, {"--out", "--tokenizer-dir"}, {});
  std::string out = a.require("--out");
  write_demo_model(out, default_demo_spec(), a.get("--tokenizer-dir", default_tokenizer_dir()));
  std::cout << "wrote demo model to " << out << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  try {
    if (cmd == "generate") return cmd_generate(argc, argv);
    if (cmd == "tokenize") return cmd_tokenize(argc, argv);
    if (cmd == "info") return cmd_info(argc, argv);
    if (cmd == "profile") return cmd_profile(argc, argv);
    if (cmd == "topology") return cmd_topology(argc, argv);
    if (cmd == "make-demo-model") return cmd_make_demo(argc, argv);
    throw UsageError("unknown command '" + cmd + "' (generate, profile, topology, tokenize, info, make-demo-model)");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "kvpr: %s (see kvpr --help)\n", e.what());
    return 2;
  } catch (const kvpr::Error& e) {
    std::fprintf(stderr, "kvpr: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvpr: error: %s\n", e.what());
    return 1;
  }
}

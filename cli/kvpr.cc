// kvpr: the command-line front end of the engine.
//   kvpr generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [options]
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

#include "engine/backend.h"
#include "engine/demo_model.h"
#include "engine/error.h"
#include "engine/generator.h"
#include "engine/json.h"
#include "engine/npy.h"
#include "engine/opt_model.h"
#include "engine/tokenizer.h"

namespace {

using namespace kvpr;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* kUsage =
    "usage: kvpr <command> [options]\n"
    "\n"
    "commands:\n"
    "  generate         --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [-n N]\n"
    "                   [--temperature T] [--top-k K] [--top-p P] [--seed S] [--stop STR]...\n"
    "                   [--ignore-eos] [--backend auto|cpu|cuda] [--kv-dtype f32|f16|bf16]\n"
    "                   [--json] [--dump-logits FILE.npy]\n"
    "  tokenize         --model DIR --text TEXT [--json]\n"
    "  info             --model DIR [--json]\n"
    "  make-demo-model  --out DIR [--tokenizer-dir DIR]\n"
    "\n"
    "Temperature 0 (the default) is greedy decoding. --prompt-ids uses the ids as given (no BOS).\n";

// Flags of one command: --name value, --flag, repeated values kept in order.
class Args {
 public:
  Args(int argc, char** argv, int start, const std::vector<std::string>& valued,
       const std::vector<std::string>& flags) {
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

int cmd_generate(int argc, char** argv) {
  Args a(argc, argv, 2,
         {"--model", "--prompt", "--prompt-ids", "-n", "--max-tokens", "--temperature", "--top-k", "--top-p",
          "--seed", "--stop", "--backend", "--kv-dtype", "--dump-logits"},
         {"--json", "--ignore-eos"});
  std::string dir = a.require("--model");
  if (a.has("--prompt") == a.has("--prompt-ids"))
    throw UsageError("give exactly one of --prompt and --prompt-ids");
  GenerationParams gp;
  gp.max_new_tokens = parse_number<int>("-n", a.get("-n", a.get("--max-tokens", "16")));
  if (gp.max_new_tokens < 0) throw UsageError("-n must be >= 0");
  gp.sampling.temperature = parse_number<float>("--temperature", a.get("--temperature", "0"));
  gp.sampling.top_k = parse_number<int>("--top-k", a.get("--top-k", "0"));
  gp.sampling.top_p = parse_number<float>("--top-p", a.get("--top-p", "1"));
  if (a.has("--seed")) gp.sampling.seed = parse_number<uint64_t>("--seed", a.get("--seed"));
  gp.stop = a.all("--stop");
  gp.ignore_eos = a.has("--ignore-eos");
  validate(gp.sampling);
  GeneratorOptions go;
  go.max_batch = 1;
  if (a.has("--kv-dtype")) {
    DType dt;
    if (!parse_dtype(a.get("--kv-dtype"), &dt)) throw UsageError("--kv-dtype: expected f32, f16 or bf16");
    go.kv_dtype = dt;
  }

  auto backend = create_backend(a.get("--backend", "auto"));
  OptModel model(*backend, dir);
  Tokenizer tok = Tokenizer::load(dir);
  std::vector<int32_t> prompt = a.has("--prompt") ? tok.encode(a.get("--prompt")) : parse_ids(a.get("--prompt-ids"));
  Generator gen(model, tok, go);
  std::vector<float> dumped;
  Generator::LogitsObserver obs;
  const int64_t V = model.config().vocab_size;
  if (a.has("--dump-logits"))
    obs = [&](uint64_t, const float* row, int64_t) { dumped.insert(dumped.end(), row, row + V); };
  auto results = gen.generate_all({prompt}, gp, obs);
  const SequenceResult& r = results.front();
  if (a.has("--dump-logits")) {
    int64_t rows = static_cast<int64_t>(dumped.size()) / V;
    write_npy_f32(a.get("--dump-logits"), dumped.data(), {rows, V});
  }
  if (a.has("--json")) {
    json::Value o(json::Object{});
    o.set("tokens", ids_json(r.tokens));
    o.set("text", r.text);
    o.set("prompt_tokens", static_cast<int64_t>(r.prompt.size()));
    o.set("prompt_ids", ids_json(r.prompt));
    o.set("finish_reason", finish_reason_name(r.finish));
    json::Array lp;
    for (float v : r.logprobs) lp.emplace_back(static_cast<double>(v));
    o.set("logprobs", std::move(lp));
    o.set("backend", backend->name());
    std::cout << o.dump() << "\n";
  } else {
    std::cout << r.text << "\n";
  }
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

int cmd_info(int argc, char** argv) {
  Args a(argc, argv, 2, {"--model", "--backend"}, {"--json"});
  std::string dir = a.require("--model");
  auto backend = create_backend(a.get("--backend", "cpu"));
  OptModel model(*backend, dir);
  const OptConfig& c = model.config();
  std::optional<Tokenizer> tok;
  try {
    tok = Tokenizer::load(dir);
  } catch (const Error&) {
    // A model without tokenizer files still has an architecture to report.
  }
  const size_t es = dtype_size(model.weight_dtype());
  const int64_t kv_per_token = 2 * c.num_layers * c.hidden_size * static_cast<int64_t>(es);
  const int64_t act_per_token = c.num_layers * c.hidden_size * static_cast<int64_t>(es);
  if (a.has("--json")) {
    json::Value o(json::Object{});
    o.set("architecture", "OPTForCausalLM");
    o.set("model_type", "opt");
    o.set("layers", c.num_layers);
    o.set("hidden_size", c.hidden_size);
    o.set("heads", c.num_heads);
    o.set("head_dim", c.head_dim());
    o.set("ffn_dim", c.ffn_dim);
    o.set("vocab_size", c.vocab_size);
    o.set("word_embed_proj_dim", c.word_embed_proj_dim);
    o.set("max_position_embeddings", c.max_position_embeddings);
    o.set("layer_norm", c.do_layer_norm_before ? "pre" : "post");
    o.set("checkpoint_format", model.checkpoint_format());
    o.set("weight_dtype", dtype_name(model.weight_dtype()));
    o.set("parameters", model.parameter_count());
    o.set("weight_bytes", static_cast<int64_t>(model.weight_bytes()));
    o.set("kv_bytes_per_token", kv_per_token);
    o.set("activation_bytes_per_token", act_per_token);
    if (tok) o.set("tokenizer_size", static_cast<int64_t>(tok->size()));
    std::cout << o.dump() << "\n";
    return 0;
  }
  std::printf("architecture          OPTForCausalLM (%s-LN%s)\n", c.do_layer_norm_before ? "pre" : "post",
              c.has_projection() ? ", projected embeddings" : "");
  std::printf("layers                %lld\n", static_cast<long long>(c.num_layers));
  std::printf("hidden / heads        %lld / %lld (head dim %lld)\n", static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.num_heads), static_cast<long long>(c.head_dim()));
  std::printf("ffn                   %lld\n", static_cast<long long>(c.ffn_dim));
  std::printf("vocab                 %lld%s\n", static_cast<long long>(c.vocab_size),
              tok ? (" (tokenizer " + std::to_string(tok->size()) + ")").c_str() : "");
  std::printf("context               %lld\n", static_cast<long long>(c.max_position_embeddings));
  std::printf("checkpoint            %s, %s\n", model.checkpoint_format().c_str(), dtype_name(model.weight_dtype()));
  std::printf("parameters            %lld (%.1fM)\n", static_cast<long long>(model.parameter_count()),
              model.parameter_count() / 1e6);
  std::printf("weight bytes          %s\n", human_bytes(static_cast<double>(model.weight_bytes())).c_str());
  std::printf("KV bytes / token      %s (K and V, all layers, %s)\n", human_bytes(kv_per_token).c_str(),
              dtype_name(model.weight_dtype()));
  std::printf("activation bytes / token  %s (layer inputs X, all layers)\n", human_bytes(act_per_token).c_str());
  return 0;
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
    if (cmd == "make-demo-model") return cmd_make_demo(argc, argv);
    throw UsageError("unknown command '" + cmd + "' (generate, tokenize, info, make-demo-model)");
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

#include "engine/text/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <queue>
#include <sstream>

#include "engine/base/error.h"
#include "engine/base/json.h"
#include "engine/base/utf8.h"
#include "engine/text/unicode.h"

namespace kvpr {

namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVPR_CHECK(f, path, ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

constexpr std::string_view kSpaceMark = "\xe2\x96\x81";  // U+2581 "▁", SentencePiece's space


}  // namespace

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp;
    int r = utf8_next(s, i, &cp);
    if (r > 0) {
      out.append(s.substr(i, r));
      i += r;
    } else {
      out += "\xef\xbf\xbd";
      // Skip the maximal subpart: invalid lead byte (1), bytes before the bad one, or the rest.
      size_t skip = r == -1 ? 1 : r == 0 ? s.size() - i : static_cast<size_t>(-r);
      i += skip;
    }
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view s) {
  // Only the last three bytes can start an incomplete sequence.
  size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = start; i < s.size(); ++i) {
    unsigned char b = static_cast<unsigned char>(s[i]);
    if ((b & 0xc0) == 0x80) continue;  // continuation byte
    char32_t cp;
    if (utf8_next(s, i, &cp) == 0) return i;
  }
  return s.size();
}

Tokenizer Tokenizer::from_files(const std::string& vocab_json, const std::string& merges_txt) {
  Tokenizer t;
  json::Value vocab = json::parse_file(vocab_json);
  KVPR_CHECK(vocab.is_object(), vocab_json, ": expected an object of token -> id");
  for (const auto& [tok, id] : vocab.as_object()) {
    KVPR_CHECK(id.is_int() && id.as_int() >= 0 && id.as_int() < (1 << 30), vocab_json, ": token '",
               tok, "' has an invalid id");
    int32_t i = static_cast<int32_t>(id.as_int());
    t.vocab_[tok] = i;
    if (static_cast<size_t>(i) >= t.id_to_token_.size()) t.id_to_token_.resize(i + 1);
    t.id_to_token_[i] = tok;
  }
  std::string merges = read_text(merges_txt);
  std::istringstream ms(merges);
  std::string line;
  int rank = 0, lineno = 0;
  while (std::getline(ms, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (lineno == 1 && line.rfind("#version", 0) == 0)) continue;
    size_t sp = line.find(' ');
    KVPR_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() &&
                   line.find(' ', sp + 1) == std::string::npos,
               merges_txt, ": line ", lineno, " is not a pair \"a b\"");
    t.merge_rank_.emplace(line, rank++);
  }
  t.gpt2_merges_ = true;
  t.pre_tokenizer_ = PreTokenizer::gpt2_byte_level(false);
  t.finish_setup();
  return t;
}

Tokenizer Tokenizer::from_tokenizer_json(const std::string& path) {
  return from_tokenizer_json(json::parse_file(path), path);
}

Tokenizer Tokenizer::from_tokenizer_json(const json::Value& tj, const std::string& path) {
  const json::Value* model = tj.find("model");
  const json::Value* type = model ? model->find("type") : nullptr;
  KVPR_CHECK(type && type->is_string() && type->as_string() == "BPE", path,
             ": only BPE models are supported (model.type is ", type && type->is_string() ? type->as_string() : "absent",
             ")");
  Tokenizer t;
  t.read_pipeline(tj, path);
  t.read_bpe_model(*model, path);
  t.finish_setup();
  return t;
}

// The normalizer, the pre-tokenizer and the decoder; which alphabet the vocabulary is in.
void Tokenizer::read_pipeline(const json::Value& tj, const std::string& path) {
  normalizer_ = Normalizer::from_json(tj.find("normalizer"), path);
  pre_tokenizer_ = PreTokenizer::from_json(tj.find("pre_tokenizer"), path);
  kind_ = pre_tokenizer_.byte_level() ? Kind::ByteLevel : Kind::Metaspace;
  // Without a decoder, the space a Metaspace pre-tokenizer puts first is dropped all the same.
  strip_leading_space_ = pre_tokenizer_.prepends_metaspace();
  if (const json::Value* d = tj.find("decoder"); d && d->is_object()) {
    strip_leading_space_ = false;
    read_decoder(d, path);
  }
}

// What decoding undoes: GPT-2's byte alphabet (ByteLevel), or "▁" and <0xNN> byte tokens
// (Replace, Metaspace, ByteFallback, Fuse), and whether the space before the text is dropped
// (Strip of one leading " ", or Metaspace with a prepend scheme).
void Tokenizer::read_decoder(const json::Value* d, const std::string& path) {
  if (!d || !d->is_object()) return;
  const json::Value* ty = d->find("type");
  const std::string type = ty && ty->is_string() ? ty->as_string() : "";
  if (type == "Sequence") {
    if (const json::Value* list = d->find("decoders"); list && list->is_array())
      for (const auto& e : list->as_array()) read_decoder(&e, path);
  } else if (type == "ByteLevel") {
    kind_ = Kind::ByteLevel;
  } else if (type == "Metaspace") {
    const json::Value* scheme = d->find("prepend_scheme");
    const json::Value* ap = d->find("add_prefix_space");
    strip_leading_space_ = !(scheme && scheme->is_string() && scheme->as_string() == "never") &&
                           !(ap && ap->is_bool() && !ap->as_bool());
  } else if (type == "Strip") {
    const json::Value* content = d->find("content");
    const json::Value* start = d->find("start");
    if (content && content->is_string() && content->as_string() == " " && start && start->is_int() && start->as_int() > 0)
      strip_leading_space_ = true;
  } else if (type != "Replace" && type != "ByteFallback" && type != "Fuse") {
    KVPR_THROW(path, ": the ", type, " decoder is not supported (kvpr has ByteLevel, Metaspace, Replace, ByteFallback, "
               "Fuse, Strip and Sequence)");
  }
}

// model.vocab, model.merges, the byte-fallback tokens and unk.
void Tokenizer::read_bpe_model(const json::Value& model_json, const std::string& path) {
  const json::Value* model = &model_json;
  const json::Value* vocab = model->find("vocab");
  KVPR_CHECK(vocab && vocab->is_object(), path, ": model.vocab must be an object of token -> id");
  for (const auto& [tok, id] : vocab->as_object()) {
    KVPR_CHECK(id.is_int() && id.as_int() >= 0 && id.as_int() < (1 << 30), path, ": token '", tok,
               "' has an invalid id");
    const int32_t i = static_cast<int32_t>(id.as_int());
    vocab_[tok] = i;
    if (static_cast<size_t>(i) >= id_to_token_.size()) id_to_token_.resize(i + 1);
    id_to_token_[i] = tok;
  }
  const json::Value* merges = model->find("merges");
  KVPR_CHECK(merges && merges->is_array(), path, ": model.merges must be a list");
  int rank = 0;
  for (const auto& m : merges->as_array()) {
    std::string key;
    if (m.is_string()) key = m.as_string();  // "a b"
    else if (m.is_array() && m.as_array().size() == 2 && m.as_array()[0].is_string() && m.as_array()[1].is_string())
      key = m.as_array()[0].as_string() + " " + m.as_array()[1].as_string();  // ["a", "b"] (tokenizers >= 0.20)
    KVPR_CHECK(!key.empty(), path, ": merge ", rank, " is neither \"a b\" nor [\"a\", \"b\"]");
    merge_rank_[std::move(key)] = rank++;  // a pair listed twice keeps its last rank, as Hugging Face's map does
  }
  byte_token_.assign(256, -1);
  const json::Value* fallback = model->find("byte_fallback");
  if (fallback && fallback->is_bool() && fallback->as_bool())
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      if (auto it = vocab_.find(name); it != vocab_.end()) byte_token_[b] = it->second;
    }
  if (const json::Value* unk = model->find("unk_token"); unk && unk->is_string())
    if (auto it = vocab_.find(unk->as_string()); it != vocab_.end()) unk_ = it->second;
  if (const json::Value* f = model->find("fuse_unk"); f && f->is_bool()) fuse_unk_ = f->as_bool();
  if (const json::Value* im = model->find("ignore_merges"); im && im->is_bool()) ignore_merges_ = im->as_bool();
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json::Value* a = model->find(affix);
    KVPR_CHECK(!a || a->is_null() || (a->is_string() && a->as_string().empty()), path, ": a BPE model with a ",
               affix, " is not supported (no causal LM kvpr serves has one)");
  }
  if (const json::Value* d = model->find("dropout"); d && d->is_number())
    KVPR_CHECK(d->as_double() == 0.0, path, ": BPE dropout (random merges) is not supported for inference");
}

void Tokenizer::finish_setup() {
  int32_t n = static_cast<int32_t>(id_to_token_.size());
  for (const auto& a : added_) n = std::max(n, a.id + 1);
  size_ = n;
  special_.assign(size_, false);
  for (const auto& a : added_)
    if (a.special) special_[a.id] = true;
  std::stable_sort(added_.begin(), added_.end(),
                   [](const Added& x, const Added& y) { return x.matched.size() > y.matched.size(); });
}

std::optional<int32_t> Tokenizer::lookup_special(const std::string& content) const {
  for (const auto& a : added_)
    if (a.content == content) return a.id;
  auto it = vocab_.find(content);
  if (it != vocab_.end()) return it->second;
  return std::nullopt;
}

namespace {
// An added or special token's text: a string, or an object with "content".
std::string content_of(const json::Value& v) {
  if (v.is_string()) return v.as_string();
  if (const json::Value* c = v.find("content"); c && c->is_string()) return c->as_string();
  return "";
}

// The special token that tokenizer.json's post-processor puts before every text (Llama-3's BOS,
// which tokenizer_config.json does not mention), or "": in a Sequence, the last processor's that
// has one.
std::string template_bos_of(const json::Value* v) {
  if (!v || !v->is_object()) return "";
  const json::Value* ty = v->find("type");
  if (ty && ty->is_string() && ty->as_string() == "Sequence") {
    std::string last;
    if (const json::Value* list = v->find("processors"); list && list->is_array())
      for (const auto& e : list->as_array())
        if (std::string bos = template_bos_of(&e); !bos.empty()) last = bos;
    return last;
  } else if (ty && ty->is_string() && ty->as_string() == "TemplateProcessing") {
    const json::Value* single = v->find("single");
    if (single && single->is_array() && !single->as_array().empty())
      if (const json::Value* st = single->as_array().front().find("SpecialToken"))
        if (const json::Value* id = st->find("id"); id && id->is_string()) return id->as_string();
  }
  return "";
}
}  // namespace

Tokenizer Tokenizer::load(const std::string& dir) {
  namespace fs = std::filesystem;
  auto path = [&](const char* f) { return (fs::path(dir) / f).string(); };
  const bool byte_level = fs::exists(path("vocab.json")) && fs::exists(path("merges.txt"));
  KVPR_CHECK(byte_level || fs::exists(path("tokenizer.json")), dir,
             ": tokenizer files vocab.json and merges.txt, or tokenizer.json, are required");
  // tokenizer.json (6 MB for Llama-3) is parsed once, for the model and the added tokens.
  const json::Value tj = fs::exists(path("tokenizer.json")) ? json::parse_file(path("tokenizer.json")) : json::Value();
  Tokenizer t = byte_level ? from_files(path("vocab.json"), path("merges.txt"))
                           : from_tokenizer_json(tj, path("tokenizer.json"));
  t.size_ = static_cast<int32_t>(t.id_to_token_.size());
  json::Value cfg;
  if (fs::exists(path("tokenizer_config.json"))) cfg = json::parse_file(path("tokenizer_config.json"));
  t.read_added_tokens(tj, cfg, dir);
  t.read_special_tokens(cfg, dir, tj.is_null() ? "" : template_bos_of(tj.find("post_processor")));
  t.read_extra_eos(dir);
  return t;
}

void Tokenizer::add_token(const std::string& content, std::optional<int32_t> id, bool special, const json::Value* flags) {
  if (content.empty()) return;
  KVPR_CHECK(valid_utf8(content), "the added token '", sanitize_utf8(content), "' is not valid UTF-8");
  KVPR_CHECK(!id || (*id >= 0 && *id < (1 << 30)), "the added token '", content, "' has an invalid id ", *id);
  for (auto& a : added_)
    if (a.content == content) {
      a.special = a.special || special;
      return;
    }
  // A token the vocabulary has keeps the vocabulary's id, as Hugging Face assigns it.
  if (auto it = vocab_.find(content); it != vocab_.end()) id = it->second;
  else if (!id) id = std::max<int32_t>(size_, static_cast<int32_t>(id_to_token_.size()));
  Added a{content, content, *id, special};
  if (flags) {
    auto flag = [&](const char* key, bool fallback) {
      const json::Value* f = flags->find(key);
      return f && f->is_bool() ? f->as_bool() : fallback;
    };
    a.lstrip = flag("lstrip", false);
    a.rstrip = flag("rstrip", false);
    a.single_word = flag("single_word", false);
    a.normalized = flag("normalized", !special);
  }
  // A normalized token is looked for in normalized text, as what the normalizer makes of it.
  if (a.normalized && !normalizer_.empty()) a.matched = normalizer_.apply(sanitize_utf8(content));
  if (a.matched.empty()) return;
  added_.push_back(std::move(a));
  size_ = std::max(size_, *id + 1);
}

// tokenizer.json's added tokens with their ids, added_tokens.json ({content: id}) and
// tokenizer_config.json's added_tokens_decoder.
void Tokenizer::read_added_tokens(const json::Value& tj, const json::Value& cfg, const std::string& dir) {
  namespace fs = std::filesystem;
  if (const json::Value* at = tj.is_null() ? nullptr : tj.find("added_tokens"); at && at->is_array()) {
    for (const auto& e : at->as_array()) {
      const json::Value* id = e.find("id");
      const json::Value* sp = e.find("special");
      KVPR_CHECK(id && id->is_int() && id->as_int() >= 0 && id->as_int() < (1 << 30),
                 "tokenizer.json: an added token without a valid id");
      add_token(content_of(e), static_cast<int32_t>(id->as_int()), sp && sp->is_bool() && sp->as_bool(), &e);
    }
  }
  if (const std::string p = (fs::path(dir) / "added_tokens.json").string(); fs::exists(p)) {
    json::Value at = json::parse_file(p);
    KVPR_CHECK(at.is_object(), "added_tokens.json: expected an object");
    for (const auto& [content, id] : at.as_object()) {
      KVPR_CHECK(id.is_int() && id.as_int() >= 0 && id.as_int() < (1 << 30), "added_tokens.json: '", content,
                 "' has no valid id");
      add_token(content, static_cast<int32_t>(id.as_int()), false);
    }
  }
  if (const json::Value* atd = cfg.find("added_tokens_decoder"); atd && atd->is_object()) {
    for (const auto& [id, e] : atd->as_object()) {
      const json::Value* sp = e.find("special");
      long i = -1;
      try {
        i = std::stol(id);
      } catch (const std::exception&) {
      }
      KVPR_CHECK(i >= 0 && i < (1 << 30), "tokenizer_config.json: added_tokens_decoder key '", id, "' is not an id");
      add_token(content_of(e), static_cast<int32_t>(i), !sp || !sp->is_bool() || sp->as_bool(), &e);
    }
  }
}

// The named special tokens (special_tokens_map.json wins over tokenizer_config.json), whether a
// BOS goes first (add_bos_token, else `template_bos` from the post-processor), add_prefix_space.
void Tokenizer::read_special_tokens(const json::Value& cfg, const std::string& dir, const std::string& template_bos) {
  namespace fs = std::filesystem;
  json::Value smap;
  if (const std::string p = (fs::path(dir) / "special_tokens_map.json").string(); fs::exists(p))
    smap = json::parse_file(p);
  const json::Value* const sources[] = {&smap, &cfg};
  const char* names[] = {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"};
  std::string found[7];
  for (int k = 0; k < 7; ++k) {
    for (const json::Value* src : sources) {
      const json::Value* v = src->find(names[k]);
      if (v && !v->is_null() && found[k].empty()) found[k] = content_of(*v);
    }
    add_token(found[k], std::nullopt, true);
  }
  for (const json::Value* src : sources) {
    if (const json::Value* extra = src->find("additional_special_tokens"); extra && extra->is_array())
      for (const auto& e : extra->as_array()) add_token(content_of(e), std::nullopt, true);
  }
  if (const json::Value* b = cfg.find("add_bos_token"); b && b->is_bool()) {
    add_bos_ = b->as_bool();
  } else if (!template_bos.empty()) {
    add_bos_ = true;
    found[0] = template_bos;  // what the post-processor prepends
  }
  if (const json::Value* b = cfg.find("add_prefix_space"); b && b->is_bool()) pre_tokenizer_.set_add_prefix_space(b->as_bool());
  finish_setup();
  if (!found[0].empty()) bos_ = lookup_special(found[0]);
  if (!found[1].empty()) eos_ = lookup_special(found[1]);
  if (!found[3].empty()) pad_ = lookup_special(found[3]);
  KVPR_CHECK(!add_bos_ || bos_, "tokenizer_config.json: add_bos_token is set but there is no bos_token");
}

// Further end-of-sequence ids: generation_config.json's eos_token_id, else config.json's (an id
// or a list of ids); ids the tokenizer cannot produce are left out.
void Tokenizer::read_extra_eos(const std::string& dir) {
  namespace fs = std::filesystem;
  for (const char* file : {"generation_config.json", "config.json"}) {
    const std::string p = (fs::path(dir) / file).string();
    if (!fs::exists(p)) continue;
    const json::Value c = json::parse_file(p);
    const json::Value* e = c.find("eos_token_id");
    if (!e || e->is_null()) continue;
    std::vector<json::Value> ids = e->is_array() ? e->as_array() : std::vector<json::Value>{*e};
    for (const auto& v : ids) {
      KVPR_CHECK(v.is_int(), file, ": eos_token_id must be an id or a list of ids");
      const int64_t id = v.as_int();
      if (id >= 0 && id < size_ && !is_eos(static_cast<int32_t>(id))) extra_eos_.push_back(static_cast<int32_t>(id));
    }
    break;
  }
}

bool Tokenizer::is_eos(int32_t id) const {
  return (eos_ && id == *eos_) || std::find(extra_eos_.begin(), extra_eos_.end(), id) != extra_eos_.end();
}

void Tokenizer::bpe(std::string_view piece, std::vector<int32_t>* out) const {
  constexpr size_t kCachedPiece = 256;  // longer pieces (a whole unsplit segment) are not cached
  if (piece.size() <= kCachedPiece) {
    std::lock_guard<std::mutex> lock(*cache_mu_);
    auto it = cache_->find(piece);
    if (it != cache_->end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  auto whole = ignore_merges_ ? vocab_.find(piece) : vocab_.end();
  if (whole != vocab_.end()) ids.push_back(whole->second);  // ignore_merges: a token is taken whole
  else bpe_merge(piece, &ids);
  out->insert(out->end(), ids.begin(), ids.end());
  if (piece.size() > kCachedPiece) return;
  std::lock_guard<std::mutex> lock(*cache_mu_);
  if (cache_->size() > 100000) cache_->clear();
  cache_->emplace(std::string(piece), std::move(ids));
}

// Hugging Face's BPE::merge_word: symbols start as characters (or the <0xNN> tokens of a
// character missing from the vocabulary); the pair of lowest merge rank is merged first, ties
// to the left; a heap of candidate pairs keeps it O(n log n) over a whole unsplit segment (or
// a pre-token of a megabyte of one letter).
namespace {
// A merge's result the vocabulary lacks, as its characters' tokens (GPT-2's reference does so).
void spell_in_characters(std::string_view t, const StringMap<int32_t>& vocab,
                         std::vector<int32_t>* out) {
  for (size_t k = 0; k < t.size();) {
    char32_t cp;
    const int len = std::max(1, utf8_next(t, k, &cp));
    auto b = vocab.find(std::string(t.substr(k, len)));
    KVPR_CHECK(b != vocab.end(), "vocabulary lacks byte symbol '", t.substr(k, len), "'");
    out->push_back(b->second);
    k += len;
  }
}
}  // namespace

void Tokenizer::bpe_merge(std::string_view word, std::vector<int32_t>* out) const {
  struct Sym {
    std::string text;
    int32_t id;  // -2: a merge the vocabulary lacks (GPT-2's reference merges on)
    int prev, next;
    bool alive = true;
  };
  std::vector<Sym> syms;
  auto push_sym = [&](std::string text, int32_t id) {
    const int n = static_cast<int>(syms.size());
    syms.push_back(Sym{std::move(text), id, n - 1, n + 1});
  };
  int32_t pending_unk = -1;  // Hugging Face's merge_word: unknown characters, fused or not
  for (size_t i = 0; i < word.size();) {
    char32_t cp;
    const int len = std::max(1, utf8_next(word, i, &cp));
    std::string ch(word.substr(i, len));
    i += len;
    if (auto it = vocab_.find(ch); it != vocab_.end()) {
      if (pending_unk >= 0) push_sym(id_to_token_[pending_unk], pending_unk), pending_unk = -1;
      push_sym(std::move(ch), it->second);
      continue;
    }
    // A character the vocabulary lacks: its <0xNN> tokens when it has them all (byte_fallback),
    // else the unknown token, else (no unknown token either) it is dropped, as Hugging Face does.
    const bool bytes = !byte_token_.empty() && std::all_of(ch.begin(), ch.end(), [&](char b) {
      return byte_token_[static_cast<unsigned char>(b)] >= 0;
    });
    if (bytes) {  // a pending unknown token stays pending across them, as in Hugging Face's merge_word
      for (unsigned char b : ch) push_sym(id_to_token_[byte_token_[b]], byte_token_[b]);
    } else if (unk_) {
      if (pending_unk >= 0 && !fuse_unk_) push_sym(id_to_token_[pending_unk], pending_unk);
      pending_unk = *unk_;
    }
  }
  if (pending_unk >= 0) push_sym(id_to_token_[pending_unk], pending_unk);
  if (syms.empty()) return;
  syms.back().next = -1;
  struct Cand {
    int rank, left;
    std::string l, r;  // the pair's texts when queued (stale if either changed)
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  std::string key;
  auto push = [&](int a) {
    if (a < 0 || syms[a].next < 0) return;
    const Sym &x = syms[a], &y = syms[x.next];
    key.assign(x.text).append(" ").append(y.text);
    if (auto it = merge_rank_.find(key); it != merge_rank_.end()) heap.push(Cand{it->second, a, x.text, y.text});
  };
  for (int i = 0; i + 1 < static_cast<int>(syms.size()); ++i) push(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    Sym& x = syms[c.left];
    if (!x.alive || x.next < 0 || x.text != c.l || syms[x.next].text != c.r) continue;
    Sym& y = syms[x.next];
    const std::string merged = x.text + y.text;
    auto it = vocab_.find(merged);
    // A merge whose result the vocabulary lacks: Hugging Face refuses such a tokenizer (here it
    // is skipped); GPT-2's reference merges on and spells what is left over in characters.
    if (it == vocab_.end() && kind_ != Kind::ByteLevel) continue;
    x.text = merged;
    x.id = it == vocab_.end() ? -2 : it->second;
    y.alive = false;
    x.next = y.next;
    if (x.next >= 0) syms[x.next].prev = c.left;
    push(x.prev);
    push(c.left);
  }
  for (int i = 0; i >= 0; i = syms[i].next) {
    if (syms[i].id >= 0) out->push_back(syms[i].id);
    else spell_in_characters(syms[i].text, vocab_, out);
  }
}

namespace {
bool space_at(std::string_view s, size_t i, size_t* len) {
  char32_t c;
  const int n = utf8_next(s, i, &c);
  *len = n > 0 ? static_cast<size_t>(n) : 1;
  return n > 0 && unicode::is_whitespace(c);
}
// Whether a word character (\w) ends s[0, i) / starts s[i, ...).
bool word_before(std::string_view s, size_t i) {
  if (i == 0) return false;
  size_t b = i - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xc0) == 0x80) --b;
  char32_t c;
  return utf8_next(s, b, &c) > 0 && unicode::is_word(c);
}
bool word_after(std::string_view s, size_t i) {
  char32_t c;
  return i < s.size() && utf8_next(s, i, &c) > 0 && unicode::is_word(c);
}
}  // namespace

std::vector<Tokenizer::AddedMatch> Tokenizer::split_added(std::string_view text, bool normalized) const {
  // Leftmost occurrence, longest at the same position (added_ is sorted longest first). Each
  // token's next occurrence is searched for again only once the text has moved past it, so a
  // text full of them costs O(tokens x length), not that per occurrence.
  std::vector<AddedMatch> out;
  constexpr size_t kUnsearched = std::string_view::npos - 1;
  std::vector<size_t> next(added_.size(), kUnsearched);
  size_t plain = 0, search = 0;
  while (search < text.size()) {
    size_t best = std::string_view::npos;
    const Added* hit = nullptr;
    for (size_t j = 0; j < added_.size(); ++j) {
      if (added_[j].normalized != normalized) continue;
      if (next[j] == kUnsearched || (next[j] != std::string_view::npos && next[j] < search))
        next[j] = text.find(added_[j].matched, search);
      if (next[j] < best) {
        best = next[j];
        hit = &added_[j];
      }
    }
    if (!hit) break;
    size_t b = best, e = best + hit->matched.size(), n = 0;
    search = e;
    if (hit->single_word && (word_before(text, b) || word_after(text, e))) continue;  // stays plain text
    if (hit->lstrip) {
      size_t k = plain;  // the whitespace run that ends at b, not before the previous token
      for (size_t i = plain; i < b; i += n)
        if (!space_at(text, i, &n)) k = i + n;
      b = k;
    }
    if (hit->rstrip)
      while (e < text.size() && space_at(text, e, &n)) e += n;
    search = e;
    if (b > plain) out.push_back({plain, b, nullptr});
    out.push_back({b, e, hit});
    plain = e;
  }
  if (plain < text.size()) out.push_back({plain, text.size(), nullptr});
  return out;
}

void Tokenizer::encode_plain(std::string_view text, bool first, std::vector<int32_t>* out) const {
  bool stripped = false;
  std::string normalized;
  if (!normalizer_.empty()) {
    normalized = normalizer_.apply(text, &stripped);
    text = normalized;
  }
  for (const AddedMatch& m : split_added(text, true)) {
    if (m.token) {
      out->push_back(m.token->id);
      continue;
    }
    const bool at_start = first && !stripped && m.begin == 0;
    pre_tokenizer_.split(text.substr(m.begin, m.end - m.begin), at_start, [&](std::string_view piece) { bpe(piece, out); });
  }
}

std::vector<int32_t> Tokenizer::encode_ordinary(std::string_view text) const {
  std::string clean;
  if (!valid_utf8(text)) text = clean = sanitize_utf8(text);
  std::vector<int32_t> out;
  encode_plain(text, true, &out);
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  std::string clean;
  if (!valid_utf8(text)) text = clean = sanitize_utf8(text);
  std::vector<int32_t> out;
  if (add_special && add_bos_ && bos_) out.push_back(*bos_);
  for (const AddedMatch& m : split_added(text, false)) {
    if (m.token) out.push_back(m.token->id);
    else encode_plain(text.substr(m.begin, m.end - m.begin), m.begin == 0, &out);
  }
  return out;
}


bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < size_ && special_[id];
}

std::string Tokenizer::token_bytes(int32_t id, bool skip_special) const {
  if (id < 0 || id >= size_ || (skip_special && is_special(id))) return "";
  // An added token decodes as its text (a normalized one as its normalized text), through the
  // same decoder as the vocabulary's tokens, as Hugging Face does.
  std::string_view tok;
  bool added = false;
  for (const auto& a : added_)
    if (a.id == id) {
      tok = a.normalized ? a.matched : a.content;
      added = true;
      break;
    }
  if (!added) {
    if (static_cast<size_t>(id) >= id_to_token_.size()) return "";
    tok = id_to_token_[id];
  }
  if (kind_ == Kind::Metaspace) {
    if (!added)
      for (int b = 0; b < 256; ++b)
        if (byte_token_[b] == id) return std::string(1, static_cast<char>(b));
    return replace_all(tok, kSpaceMark, " ");
  }
  // Byte-level: each character is the byte it stands for; a token with a character outside
  // GPT-2's alphabet (an added "<｜fim▁hole｜>") is its text as it is.
  std::string out;
  for (size_t i = 0; i < tok.size();) {
    char32_t cp;
    const int len = utf8_next(tok, i, &cp);
    const int b = len > 0 ? byte_level_byte(cp) : -1;
    if (b < 0) return std::string(tok);
    out.push_back(static_cast<char>(b));
    i += static_cast<size_t>(len);
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  // <0xNN> tokens in a row make their bytes' text when it is UTF-8, else one U+FFFD per byte
  // (Hugging Face's ByteFallback decoder).
  std::string run;
  auto flush = [&] {
    if (valid_utf8(run)) bytes += run;
    else
      for (size_t k = 0; k < run.size(); ++k) bytes += "\xef\xbf\xbd";
    run.clear();
  };
  for (int32_t id : ids) {
    const auto b = kind_ == Kind::Metaspace && !byte_token_.empty() && id >= 0
                       ? std::find(byte_token_.begin(), byte_token_.end(), id) : byte_token_.end();
    if (b != byte_token_.end()) {
      run.push_back(static_cast<char>(b - byte_token_.begin()));
      continue;
    }
    flush();
    bytes += token_bytes(id, skip_special);
  }
  flush();
  if (strip_leading_space_ && !bytes.empty() && bytes[0] == ' ') bytes.erase(0, 1);
  return sanitize_utf8(bytes);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  for (const auto& a : added_)
    if (a.id == id) return a.content;
  if (id >= 0 && static_cast<size_t>(id) < id_to_token_.size()) return id_to_token_[id];
  return "";
}

std::optional<int32_t> Tokenizer::token_to_id(const std::string& token) const {
  return lookup_special(token);
}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_.token_bytes(id, skip_special_);
  size_t n = utf8_complete_prefix(pending_);
  std::string out = sanitize_utf8(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace kvpr

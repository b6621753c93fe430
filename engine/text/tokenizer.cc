#include "engine/text/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <queue>
#include <sstream>

#include "engine/base/error.h"
#include "engine/base/json.h"
#include "engine/text/unicode_nfc.h"
#include "engine/base/utf8.h"

namespace kvpr {

namespace {

struct CodeRange {
  char32_t lo, hi;
};
#include "engine/text/unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodeRange (&r)[N], char32_t c) {
  size_t lo = 0, hi = N;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (c < r[mid].lo) hi = mid;
    else if (c > r[mid].hi) lo = mid + 1;
    else return true;
  }
  return false;
}

enum class CharClass { Letter, Number, Space, Other };

CharClass classify(char32_t c) {
  if (c < 0x80) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::Letter;
    if (c >= '0' && c <= '9') return CharClass::Number;
    if (c == ' ' || (c >= 0x09 && c <= 0x0d)) return CharClass::Space;
    return CharClass::Other;
  }
  if (in_ranges(kLetterRanges, c)) return CharClass::Letter;
  if (in_ranges(kNumberRanges, c)) return CharClass::Number;
  if (in_ranges(kSpaceRanges, c)) return CharClass::Space;
  return CharClass::Other;
}

// Character at byte i for the pre-tokenizer: class and byte length (invalid bytes: 1, Other).
struct Char {
  CharClass cls;
  size_t len;
};
Char char_at(std::string_view s, size_t i) {
  char32_t cp;
  int n = utf8_next(s, i, &cp);
  if (n <= 0) return {CharClass::Other, 1};
  return {classify(cp), static_cast<size_t>(n)};
}

// GPT-2's byte <-> unicode mapping: printable bytes stand for themselves, the others are
// shifted to U+0100 and up so that every byte has a visible, non-space character.
struct ByteMap {
  std::string encode[256];  // byte -> UTF-8 of its character
  int16_t decode[512];      // code point -> byte, -1 if none
  ByteMap() {
    std::fill(std::begin(decode), std::end(decode), static_cast<int16_t>(-1));
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
      char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      append_utf8(encode[b], cp);
      decode[cp] = static_cast<int16_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVPR_CHECK(f, path, ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

namespace {
bool is_cr_lf(std::string_view s, size_t i) { return s[i] == '\r' || s[i] == '\n'; }
char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }
}  // namespace

// Llama-3's pattern (Qwen2's with max_digits 1), alternative by alternative:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3} |
//    ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
std::vector<std::string_view> pretokenize_llama3(std::string_view s, int max_digits) {
  std::vector<std::string_view> out;
  const size_t n = s.size();
  auto emit = [&](size_t from, size_t to) { out.push_back(s.substr(from, to - from)); };
  auto cls_at = [&](size_t k) { return k < n ? char_at(s, k).cls : CharClass::Space; };
  size_t i = 0;
  while (i < n) {
    if (s[i] == '\'' && i + 1 < n) {  // contractions, in any case
      const char a = ascii_lower(s[i + 1]);
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        emit(i, i + 2);
        i += 2;
        continue;
      }
      if (i + 2 < n) {
        const char b = ascii_lower(s[i + 2]);
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
          emit(i, i + 3);
          i += 3;
          continue;
        }
      }
    }
    const Char c = char_at(s, i);
    // A letter run, with one leading character that is no letter, digit, CR or LF.
    size_t j = i;
    if (c.cls != CharClass::Letter && c.cls != CharClass::Number && !is_cr_lf(s, i) &&
        cls_at(i + c.len) == CharClass::Letter)
      j = i + c.len;
    if (j < n && cls_at(j) == CharClass::Letter) {
      size_t k = j;
      while (k < n && cls_at(k) == CharClass::Letter) k += char_at(s, k).len;
      emit(i, k);
      i = k;
      continue;
    }
    if (c.cls == CharClass::Number) {  // up to max_digits digits
      size_t k = i;
      for (int d = 0; d < max_digits && k < n && cls_at(k) == CharClass::Number; ++d) k += char_at(s, k).len;
      emit(i, k);
      i = k;
      continue;
    }
    // Punctuation and symbols (after an optional space), with the CR/LF that follow them.
    j = i + (s[i] == ' ' ? 1 : 0);
    if (j < n && cls_at(j) == CharClass::Other) {
      size_t k = j;
      while (k < n && cls_at(k) == CharClass::Other) k += char_at(s, k).len;
      while (k < n && is_cr_lf(s, k)) ++k;
      emit(i, k);
      i = k;
      continue;
    }
    // Whitespace: up to its last CR/LF if it holds one; else all of it, less its last character
    // when a non-space follows and it has more than one.
    size_t k = i, last_nl = std::string_view::npos, last_start = i;
    while (k < n && cls_at(k) == CharClass::Space) {
      if (is_cr_lf(s, k)) last_nl = k;
      last_start = k;
      k += char_at(s, k).len;
    }
    size_t end = k;
    if (last_nl != std::string_view::npos) end = last_nl + 1;
    else if (k < n && last_start > i) end = last_start;
    emit(i, end);
    i = end;
  }
  return out;
}

std::vector<std::string_view> pretokenize(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // 's 't 're 've 'm 'll 'd
    if (s[i] == '\'' && i + 1 < n) {
      char a = s[i + 1];
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        out.push_back(s.substr(i, 2));
        i += 2;
        continue;
      }
      if (i + 2 < n) {
        char b = s[i + 2];
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
          out.push_back(s.substr(i, 3));
          i += 3;
          continue;
        }
      }
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
    size_t j = i + (s[i] == ' ' ? 1 : 0);
    if (j < n) {
      Char c = char_at(s, j);
      if (c.cls != CharClass::Space) {
        size_t k = j + c.len;
        while (k < n) {
          Char d = char_at(s, k);
          if (d.cls != c.cls) break;
          k += d.len;
        }
        out.push_back(s.substr(i, k - i));
        i = k;
        continue;
      }
    }
    // '\s+(?!\S)' then '\s+': a whitespace run; when it is followed by a non-space, its
    // last character is left to start the next token (so " word" keeps its space).
    std::vector<size_t> starts;
    size_t k = i;
    while (k < n) {
      Char d = char_at(s, k);
      if (d.cls != CharClass::Space) break;
      starts.push_back(k);
      k += d.len;
    }
    if (starts.empty()) {  // cannot happen: a non-space was handled above
      out.push_back(s.substr(i, 1));
      ++i;
      continue;
    }
    size_t end = (k < n && starts.size() >= 2) ? starts.back() : k;
    out.push_back(s.substr(i, end - i));
    i = end;
  }
  return out;
}

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
  t.finish_setup();
  return t;
}

namespace {
constexpr std::string_view kSpaceMark = "\xe2\x96\x81";  // U+2581 "▁", SentencePiece's space

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, from.size(), from) == 0) {
      out.append(to);
      i += from.size();
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}
}  // namespace

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
  t.read_pretokenizers(tj, *model, path);
  t.read_bpe_model(*model, path);
  t.finish_setup();
  return t;
}

// The normalizers and pre-tokenizers: which kind of BPE, its split pattern, where "▁" goes.
void Tokenizer::read_pretokenizers(const json::Value& tj, const json::Value& model, const std::string& path) {
  kind_ = Kind::Metaspace;
  // Where "▁" comes from: the Prepend + Replace normalizers (Llama-2 as released) or the
  // Metaspace pre-tokenizer (later conversions). A ByteLevel pre-tokenizer makes a byte-level
  // BPE: with its own regex (GPT-2's pattern) or after a Split by a pattern kvpr knows.
  bool metaspace = false, byte_level = false;
  std::optional<Pattern> split;
  auto visit = [&](const json::Value* v, auto&& self) -> void {
    if (!v || !v->is_object()) return;
    const json::Value* ty = v->find("type");
    const std::string kind = ty && ty->is_string() ? ty->as_string() : "";
    if (kind == "Sequence") {
      for (const char* key : {"normalizers", "pretokenizers"})
        if (const json::Value* list = v->find(key); list && list->is_array())
          for (const auto& e : list->as_array()) self(&e, self);
    } else if (kind == "Prepend") {
      metaspace = true;
      prepend_ = Prepend::Always;
    } else if (kind == "Metaspace") {
      metaspace = true;
      prepend_ = Prepend::Always;
      if (const json::Value* ps = v->find("prepend_scheme"); ps && ps->is_string())
        prepend_ = ps->as_string() == "first" ? Prepend::First : ps->as_string() == "never" ? Prepend::Never : Prepend::Always;
      else if (const json::Value* ap = v->find("add_prefix_space"); ap && ap->is_bool() && !ap->as_bool())
        prepend_ = Prepend::Never;
      const json::Value* sp = v->find("split");
      split_words_ = !sp || !sp->is_bool() || sp->as_bool();
    } else if (kind == "Split") {
      const json::Value* pat = v->find("pattern");
      const json::Value* re = pat ? pat->find("Regex") : nullptr;
      const json::Value* behavior = v->find("behavior");
      const json::Value* invert = v->find("invert");
      KVPR_CHECK(re && re->is_string(), path, ": a Split pre-tokenizer without a regex pattern is not supported");
      KVPR_CHECK(behavior && behavior->is_string() && behavior->as_string() == "Isolated" &&
                     !(invert && invert->is_bool() && invert->as_bool()),
                 path, ": only Split pre-tokenizers with behavior Isolated are supported");
      static const std::string kLlama3 =
          "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
      static const std::string kQwen2 =
          "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
      static const std::string kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
      const std::string& r = re->as_string();
      KVPR_CHECK(!split, path, ": more than one Split pre-tokenizer is not supported");
      if (r == kLlama3) split = Pattern::Llama3;
      else if (r == kQwen2) split = Pattern::Qwen2;
      else if (r == kGpt2) split = Pattern::Gpt2;
      else KVPR_THROW(path, ": the Split pre-tokenizer's pattern is not one kvpr knows (GPT-2's, Llama-3's, Qwen2's): ", r);
    } else if (kind == "ByteLevel") {
      byte_level = true;
      const json::Value* use_regex = v->find("use_regex");
      if (!use_regex || !use_regex->is_bool() || use_regex->as_bool()) {
        KVPR_CHECK(!split, path, ": a Split followed by a ByteLevel pre-tokenizer with its own regex is not supported");
        split = Pattern::Gpt2;
      }
      if (const json::Value* ap = v->find("add_prefix_space"); ap && ap->is_bool()) add_prefix_space_ = ap->as_bool();
    } else if (kind == "Replace") {  // Llama-2's " " -> "▁", part of the Metaspace scheme
      const json::Value* pat = v->find("pattern");
      const json::Value* from = pat ? pat->find("String") : nullptr;
      const json::Value* to = v->find("content");
      KVPR_CHECK(from && from->is_string() && from->as_string() == " " && to && to->is_string() &&
                     to->as_string() == kSpaceMark,
                 path, ": only the Replace normalizer of \" \" by \"▁\" is supported");
    } else if (kind == "NFC") {  // Qwen2's
      nfc_ = true;
    } else if (!kind.empty()) {
      KVPR_THROW(path, ": the ", kind, " normalizer or pre-tokenizer is not supported");
    }
  };
  visit(tj.find("normalizer"), visit);
  visit(tj.find("pre_tokenizer"), visit);
  if (byte_level) {
    KVPR_CHECK(!metaspace, path, ": a byte-level BPE with a \"▁\" normalizer is not supported");
    KVPR_CHECK(split, path, ": a ByteLevel pre-tokenizer without a regex and without a Split before it is not supported");
    kind_ = Kind::ByteLevel;
    pattern_ = *split;
    if (const json::Value* im = model.find("ignore_merges"); im && im->is_bool()) ignore_merges_ = im->as_bool();
  } else {
    KVPR_CHECK(metaspace, path, ": a BPE model without a ByteLevel or Metaspace pre-tokenizer or a \"▁\" Prepend normalizer is not supported");
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
    merge_rank_.emplace(std::move(key), rank++);
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
}

void Tokenizer::finish_setup() {
  int32_t n = static_cast<int32_t>(id_to_token_.size());
  for (const auto& a : added_) n = std::max(n, a.id + 1);
  size_ = n;
  special_.assign(size_, false);
  for (const auto& a : added_)
    if (a.special) special_[a.id] = true;
  std::stable_sort(added_.begin(), added_.end(),
                   [](const Added& x, const Added& y) { return x.content.size() > y.content.size(); });
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

void Tokenizer::add_token(const std::string& content, std::optional<int32_t> id, bool special) {
  if (content.empty()) return;
  for (auto& a : added_)
    if (a.content == content) {
      a.special = a.special || special;
      return;
    }
  if (!id) {
    auto it = vocab_.find(content);
    id = it != vocab_.end() ? it->second : std::max<int32_t>(size_, static_cast<int32_t>(id_to_token_.size()));
  }
  added_.push_back({content, *id, special});
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
      KVPR_CHECK(id && id->is_int(), "tokenizer.json: added token without an integer id");
      add_token(content_of(e), static_cast<int32_t>(id->as_int()), sp && sp->is_bool() && sp->as_bool());
    }
  }
  if (const std::string p = (fs::path(dir) / "added_tokens.json").string(); fs::exists(p)) {
    json::Value at = json::parse_file(p);
    KVPR_CHECK(at.is_object(), "added_tokens.json: expected an object");
    for (const auto& [content, id] : at.as_object()) add_token(content, static_cast<int32_t>(id.as_int()), false);
  }
  if (const json::Value* atd = cfg.find("added_tokens_decoder"); atd && atd->is_object()) {
    for (const auto& [id, e] : atd->as_object()) {
      const json::Value* sp = e.find("special");
      int32_t i = 0;
      try {
        i = static_cast<int32_t>(std::stol(id));
      } catch (const std::exception&) {
        KVPR_THROW("tokenizer_config.json: added_tokens_decoder key '", id, "' is not an id");
      }
      add_token(content_of(e), i, !sp || !sp->is_bool() || sp->as_bool());
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
  if (const json::Value* b = cfg.find("add_prefix_space"); b && b->is_bool()) add_prefix_space_ = b->as_bool();
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
  {
    std::lock_guard<std::mutex> lock(*cache_mu_);
    auto it = cache_->find(std::string(piece));
    if (it != cache_->end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  // Bytes become GPT-2's visible characters, which are all in a byte-level vocabulary; then
  // the pair of lowest rank merges first. (GPT-2's reference merges every occurrence of that
  // pair at once; since a merge's product only appears in later merges, the order is the same.)
  const ByteMap& bm = byte_map();
  std::string mapped;
  for (unsigned char b : piece) mapped += bm.encode[b];
  std::vector<int32_t> ids;
  auto whole = ignore_merges_ ? vocab_.find(mapped) : vocab_.end();
  if (whole != vocab_.end()) ids.push_back(whole->second);  // ignore_merges: a token is taken whole
  else bpe_merge(mapped, &ids);
  out->insert(out->end(), ids.begin(), ids.end());
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
void spell_in_characters(std::string_view t, const std::unordered_map<std::string, int32_t>& vocab,
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
    int32_t id;  // -1: a run of byte tokens, in `bytes`; -2: a merge the vocabulary lacks
    std::vector<int32_t> bytes;
    int prev, next;
    bool alive = true;
  };
  std::vector<Sym> syms;
  for (size_t i = 0; i < word.size();) {
    char32_t cp;
    const int len = std::max(1, utf8_next(word, i, &cp));
    std::string ch(word.substr(i, len));
    const int n = static_cast<int>(syms.size());
    if (auto it = vocab_.find(ch); it != vocab_.end()) {
      syms.push_back(Sym{ch, it->second, {}, n - 1, n + 1});
    } else {
      Sym s{ch, -1, {}, n - 1, n + 1};
      for (unsigned char b : ch) {
        const int32_t id = byte_token_.empty() ? -1 : byte_token_[b];
        if (id >= 0) s.bytes.push_back(id);
        else if (unk_ && (s.bytes.empty() || s.bytes.back() != *unk_)) s.bytes.push_back(*unk_);
      }
      KVPR_CHECK(!s.bytes.empty() || unk_, "character '", ch, "' is not in the vocabulary and has no byte tokens");
      syms.push_back(std::move(s));
    }
    i += len;
  }
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
    if (x.id == -1 || y.id == -1) return;  // byte tokens never merge
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
    if (syms[i].id >= 0) {
      out->push_back(syms[i].id);
    } else if (syms[i].id == -1) {
      out->insert(out->end(), syms[i].bytes.begin(), syms[i].bytes.end());
    } else {
      spell_in_characters(syms[i].text, vocab_, out);
    }
  }
}

void Tokenizer::encode_plain(std::string_view text, bool first, std::vector<int32_t>* out) const {
  std::string normalized;
  if (nfc_ && !nfc_quick_yes(text)) {
    normalized = to_nfc(text);
    text = normalized;
  }
  if (kind_ == Kind::ByteLevel) {
    const std::vector<std::string_view> pieces =
        pattern_ == Pattern::Gpt2 ? pretokenize(text) : pretokenize_llama3(text, pattern_ == Pattern::Llama3 ? 3 : 1);
    for (std::string_view p : pieces) bpe(p, out);
    return;
  }
  if (text.empty()) return;
  std::string s = replace_all(text, " ", kSpaceMark);
  if (prepend_ == Prepend::Always || (prepend_ == Prepend::First && first)) s.insert(0, kSpaceMark);
  if (!split_words_) return bpe_merge(s, out);
  // Metaspace(split): each word begins at a "▁".
  size_t start = 0;
  for (size_t i = kSpaceMark.size(); i <= s.size(); ++i)
    if (i == s.size() || s.compare(i, kSpaceMark.size(), kSpaceMark) == 0) {
      if (i > start) bpe_merge(std::string_view(s).substr(start, i - start), out);
      start = i;
      if (i == s.size()) break;
      i += kSpaceMark.size() - 1;
    }
}

std::vector<int32_t> Tokenizer::encode_ordinary(std::string_view text) const {
  std::vector<int32_t> out;
  encode_plain(text, true, &out);
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> out;
  if (add_special && add_bos_ && bos_) out.push_back(*bos_);
  std::string prefixed;
  if (kind_ == Kind::ByteLevel && add_prefix_space_ && !text.empty() && text[0] != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(text);
    text = prefixed;
  }
  // Split on added tokens (leftmost occurrence; longest at the same position). Each token's
  // next occurrence is searched for again only once the text has moved past it, so a text
  // full of them costs O(tokens x length), not that per occurrence.
  size_t pos = 0;
  constexpr size_t kUnsearched = std::string_view::npos - 1;
  std::vector<size_t> next(added_.size(), kUnsearched);
  while (pos < text.size()) {
    size_t best = std::string_view::npos;
    const Added* hit = nullptr;
    for (size_t j = 0; j < added_.size(); ++j) {
      if (next[j] == kUnsearched || (next[j] != std::string_view::npos && next[j] < pos))
        next[j] = text.find(added_[j].content, pos);
      if (next[j] < best) {
        best = next[j];
        hit = &added_[j];
      }
    }
    std::string_view plain = text.substr(pos, hit ? best - pos : std::string_view::npos);
    encode_plain(plain, pos == 0, &out);
    if (!hit) break;
    out.push_back(hit->id);
    pos = best + hit->content.size();
  }
  return out;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < size_ && special_[id];
}

std::string Tokenizer::token_bytes(int32_t id, bool skip_special) const {
  if (id < 0 || id >= size_) return "";
  if (is_special(id)) {
    if (skip_special) return "";
    for (const auto& a : added_)
      if (a.id == id) return a.content;
  }
  for (const auto& a : added_)
    if (a.id == id) return a.content;
  if (static_cast<size_t>(id) >= id_to_token_.size()) return "";
  const std::string& tok = id_to_token_[id];
  if (kind_ == Kind::Metaspace) {
    for (int b = 0; b < 256; ++b)
      if (byte_token_[b] == id) return std::string(1, static_cast<char>(b));
    return replace_all(tok, kSpaceMark, " ");
  }
  const ByteMap& bm = byte_map();
  std::string out;
  std::string_view sv = tok;
  for (size_t i = 0; i < sv.size();) {
    char32_t cp;
    int len = utf8_next(sv, i, &cp);
    if (len <= 0) {
      out.push_back(sv[i]);
      ++i;
      continue;
    }
    if (cp < 512 && bm.decode[cp] >= 0) out.push_back(static_cast<char>(bm.decode[cp]));
    else out.append(sv.substr(i, len));  // not byte-level (e.g. "<s>" kept verbatim)
    i += len;
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) bytes += token_bytes(id, skip_special);
  if (kind_ == Kind::Metaspace && prepend_ != Prepend::Never && !bytes.empty() && bytes[0] == ' ') bytes.erase(0, 1);
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

#include "engine/text/pre_tokenizer.h"

#include <algorithm>

#include "engine/base/error.h"
#include "engine/base/json.h"
#include "engine/base/utf8.h"
#include "engine/text/unicode.h"

namespace kvpr {

// ---- GPT-2's byte-level alphabet ----

namespace {
struct ByteMap {
  std::string encode[256];  // byte -> UTF-8 of its character
  int16_t decode[512];      // code point -> byte, -1 if none
  ByteMap() {
    std::fill(std::begin(decode), std::end(decode), static_cast<int16_t>(-1));
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      append_utf8(encode[b], cp);
      decode[cp] = static_cast<int16_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}
}  // namespace

const std::string& byte_level_char(unsigned char b) { return byte_map().encode[b]; }
int byte_level_byte(char32_t c) { return c < 512 ? byte_map().decode[c] : -1; }

// ---- The fast splitters: GPT-2's, Llama-3's and Qwen2's patterns by hand ----

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

}  // namespace

namespace {
bool is_cr_lf(std::string_view s, size_t i) { return s[i] == '\r' || s[i] == '\n'; }
char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }
}  // namespace

// Llama-3's pattern (Qwen2's with max_digits 1), alternative by alternative:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3} |
//    ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
namespace {
// The splitters call piece(view) for each pre-token, in order.
template <typename Piece>
void split_llama3(std::string_view s, int max_digits, Piece&& piece) {
  const size_t n = s.size();
  auto emit = [&](size_t from, size_t to) { piece(s.substr(from, to - from)); };
  auto cls_at = [&](size_t k) { return k < n ? char_at(s, k).cls : CharClass::Space; };
  size_t i = 0;
  while (i < n) {
    if (s[i] == '\'' && i + 2 < n && s[i + 1] == '\xc5' && s[i + 2] == '\xbf') {  // 'ſ: U+017F folds to s
      emit(i, i + 3);
      i += 3;
      continue;
    }
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
}

template <typename Piece>
void split_gpt2(std::string_view s, Piece&& piece) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // 's 't 're 've 'm 'll 'd
    if (s[i] == '\'' && i + 1 < n) {
      char a = s[i + 1];
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        piece(s.substr(i, 2));
        i += 2;
        continue;
      }
      if (i + 2 < n) {
        char b = s[i + 2];
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
          piece(s.substr(i, 3));
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
        piece(s.substr(i, k - i));
        i = k;
        continue;
      }
    }
    // '\s+(?!\S)' then '\s+': a whitespace run; when it is followed by a non-space, its
    // last character is left to start the next token (so " word" keeps its space).
    size_t k = i, spaces = 0, last = i;
    while (k < n) {
      Char d = char_at(s, k);
      if (d.cls != CharClass::Space) break;
      ++spaces;
      last = k;
      k += d.len;
    }
    if (spaces == 0) {  // cannot happen: a non-space was handled above
      piece(s.substr(i, 1));
      ++i;
      continue;
    }
    size_t end = (k < n && spaces >= 2) ? last : k;
    piece(s.substr(i, end - i));
    i = end;
  }
}
}  // namespace

std::vector<std::string_view> pretokenize_llama3(std::string_view s, int max_digits) {
  std::vector<std::string_view> out;
  split_llama3(s, max_digits, [&](std::string_view p) { out.push_back(p); });
  return out;
}

std::vector<std::string_view> pretokenize(std::string_view s) {
  std::vector<std::string_view> out;
  split_gpt2(s, [&](std::string_view p) { out.push_back(p); });
  return out;
}

// ---- The general path ----

namespace {
constexpr int kMaxDepth = 16;     // nested Sequences
constexpr size_t kMaxSteps = 64;  // steps in all (each runs once per piece, recursively)

const std::string kGpt2Pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const std::string kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const std::string kQwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

SplitBehavior behavior_of(const json::Value& v, const std::string& where) {
  const json::Value* b = v.find("behavior");
  if (!b || b->is_null()) return SplitBehavior::Isolated;
  KVPR_CHECK(b->is_string(), where, ": behavior must be a string");
  const std::string& s = b->as_string();
  if (s == "Removed") return SplitBehavior::Removed;
  if (s == "Isolated") return SplitBehavior::Isolated;
  if (s == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (s == "Contiguous") return SplitBehavior::Contiguous;
  KVPR_THROW(where, ": unknown behavior ", s);
}

bool flag(const json::Value& v, const char* key, bool fallback) {
  const json::Value* f = v.find(key);
  return f && f->is_bool() ? f->as_bool() : fallback;
}

char32_t single_char(const std::string& s, const std::string& where) {
  char32_t c = 0;
  KVPR_CHECK(!s.empty() && utf8_next(s, 0, &c) == static_cast<int>(s.size()), where, " must be one character");
  return c;
}

// Each character for which pred holds is a match of its own (Hugging Face's Pattern for a
// char predicate); the characters between are unmatched spans.
template <typename Pred>
std::vector<PatternSpan> char_matches(std::string_view s, Pred&& pred) {
  if (s.empty()) return {{0, 0, false}};
  std::vector<PatternSpan> out;
  size_t last = 0;
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    const int n = std::max(1, utf8_next(s, i, &c));
    if (pred(c)) {
      if (last < i) out.push_back({last, i, false});
      out.push_back({i, i + n, true});
      last = i + n;
    }
    i += static_cast<size_t>(n);
  }
  if (last < s.size()) out.push_back({last, s.size(), false});
  return out;
}

// The ranges a behaviour keeps of a text's matches (Hugging Face's NormalizedString::split).
std::vector<std::pair<size_t, size_t>> apply_behavior(const std::vector<PatternSpan>& spans, SplitBehavior b) {
  std::vector<std::pair<size_t, size_t>> out;
  bool prev = false;
  switch (b) {
    case SplitBehavior::Isolated:
      for (const auto& m : spans) out.push_back({m.begin, m.end});
      break;
    case SplitBehavior::Removed:
      for (const auto& m : spans)
        if (!m.match) out.push_back({m.begin, m.end});
      break;
    case SplitBehavior::Contiguous:
      for (const auto& m : spans) {
        if (m.match == prev && !out.empty()) out.back().second = m.end;
        else out.push_back({m.begin, m.end});
        prev = m.match;
      }
      break;
    case SplitBehavior::MergedWithPrevious:
      for (const auto& m : spans) {
        if (m.match && !prev && !out.empty()) out.back().second = m.end;
        else out.push_back({m.begin, m.end});
        prev = m.match;
      }
      break;
    case SplitBehavior::MergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !prev && !out.empty()) out.back().first = it->begin;
        else out.push_back({it->begin, it->end});
        prev = it->match;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  return out;
}

}  // namespace

PreTokenizer PreTokenizer::from_json(const json::Value* v, const std::string& path) {
  PreTokenizer p;
  if (v && !v->is_null()) p.add(*v, path, 0);
  return p;
}

PreTokenizer PreTokenizer::gpt2_byte_level(bool add_prefix_space) {
  PreTokenizer p;
  Step s(Kind::ByteLevel);
  s.add_prefix_space = add_prefix_space;
  s.fast = Fast::Gpt2;
  if (unicode::available()) s.pattern = Pattern::regex(kGpt2Pattern);
  p.steps_.push_back(std::move(s));
  return p;
}

void PreTokenizer::add_split(Pattern pattern, SplitBehavior behavior, bool invert) {
  Step s(Kind::Split);
  s.pattern = std::move(pattern);
  s.behavior = behavior;
  s.invert = invert;
  steps_.push_back(std::move(s));
}

void PreTokenizer::add(const json::Value& v, const std::string& path, int depth) {
  KVPR_CHECK(depth < kMaxDepth, path, ": pre-tokenizers nested deeper than ", kMaxDepth);
  const json::Value* ty = v.find("type");
  KVPR_CHECK(ty && ty->is_string(), path, ": a pre-tokenizer without a type");
  const std::string& type = ty->as_string();
  const std::string where = path + ": the " + type + " pre-tokenizer";
  const auto& table = kinds();
  const auto it = table.find(type);
  if (it == table.end()) {
    std::string names;
    for (const auto& [name, f] : table) names += (names.empty() ? "" : ", ") + name;
    KVPR_THROW(where, " is not supported (kvpr has ", names, ")");
  }
  it->second(*this, v, where, path, depth);
  KVPR_CHECK(steps_.size() <= kMaxSteps, path, ": more than ", kMaxSteps, " pre-tokenizers");
  KVPR_CHECK(std::count_if(steps_.begin(), steps_.end(), [](const Step& x) { return x.kind == Kind::ByteLevel; }) <= 1,
             path, ": more than one ByteLevel pre-tokenizer (each maps every byte again, doubling the text)");
  if (type == "Split" || type == "ByteLevel" || type == "Metaspace" || type == "Sequence") return;
  KVPR_CHECK(unicode::available(), where, " needs utf8proc and Oniguruma, and this kvpr was built without them "
             "(KVPR_TEXT_LIBS=OFF)");
}

// Each pre-tokenizer type of tokenizer.json, as the steps it adds.
const std::map<std::string, PreTokenizer::AddFn>& PreTokenizer::kinds() {
  // A character-class split of one behaviour.
  static const auto char_split = [](CharSet chars, SplitBehavior behavior) {
    Step s(Kind::CharSplit);
    s.chars = chars;
    s.behavior = behavior;
    return s;
  };
  static const std::map<std::string, AddFn> table = {
      {"Sequence",
       [](PreTokenizer& p, const json::Value& v, const std::string& where, const std::string& path, int depth) {
         const json::Value* list = v.find("pretokenizers");
         KVPR_CHECK(list && list->is_array(), where, " has no list of pre-tokenizers");
         for (const auto& e : list->as_array()) p.add(e, path, depth + 1);
       }},
      {"Split",
       [](PreTokenizer& p, const json::Value& v, const std::string& where, const std::string&, int) {
         const json::Value* pat = v.find("pattern");
         KVPR_CHECK(pat, where, " has no pattern");
         Step s(Kind::Split);
         // Pieces of a regex kvpr has a splitter for keep the splitter; without Oniguruma they
         // are the only Split patterns that load.
         if (const json::Value* re = pat->find("Regex"); re && re->is_string()) {
           const std::string& r = re->as_string();
           s.fast = r == kGpt2Pattern ? Fast::Gpt2 : r == kLlama3Pattern ? Fast::Llama3 : r == kQwen2Pattern ? Fast::Qwen2 : Fast::None;
         }
         if (s.fast == Fast::None || unicode::available()) s.pattern = Pattern::from_json(*pat, where);
         s.behavior = behavior_of(v, where);
         s.invert = flag(v, "invert", false);
         p.steps_.push_back(std::move(s));
       }},
      {"ByteLevel",
       [](PreTokenizer& p, const json::Value& v, const std::string&, const std::string&, int) {
         Step s(Kind::ByteLevel);
         s.add_prefix_space = flag(v, "add_prefix_space", true);
         s.use_regex = flag(v, "use_regex", true);
         if (s.use_regex) {
           s.fast = Fast::Gpt2;
           if (unicode::available()) s.pattern = Pattern::regex(kGpt2Pattern);
         }
         p.steps_.push_back(std::move(s));
       }},
      {"Metaspace",
       [](PreTokenizer& p, const json::Value& v, const std::string& where, const std::string&, int) {
         Step s(Kind::Metaspace);
         const json::Value* r = v.find("replacement");
         s.replacement = r && r->is_string() ? r->as_string() : "\xe2\x96\x81";
         single_char(s.replacement, where + "'s replacement");
         const json::Value* scheme = v.find("prepend_scheme");
         if (scheme && scheme->is_string()) {
           const std::string& k = scheme->as_string();
           KVPR_CHECK(k == "always" || k == "first" || k == "never", where, ": unknown prepend_scheme ", k);
           s.prepend = k == "always" ? 0 : k == "first" ? 1 : 2;
         }
         if (!flag(v, "add_prefix_space", true)) s.prepend = 2;
         s.split = flag(v, "split", true);
         p.steps_.push_back(std::move(s));
       }},
      {"Whitespace",
       [](PreTokenizer& p, const json::Value&, const std::string&, const std::string&, int) {
         // Rust's regex crate, which runs this one in Hugging Face's, counts Join_Control
         // (U+200C, U+200D) in \w; Oniguruma does not.
         p.add_split(Pattern::regex("[\\w\\x{200C}\\x{200D}]+|[^\\w\\s\\x{200C}\\x{200D}]+"), SplitBehavior::Removed, true);
       }},
      {"WhitespaceSplit",
       [](PreTokenizer& p, const json::Value&, const std::string&, const std::string&, int) {
         p.steps_.push_back(char_split(CharSet::Whitespace, SplitBehavior::Removed));
       }},
      {"BertPreTokenizer",
       [](PreTokenizer& p, const json::Value&, const std::string&, const std::string&, int) {
         p.steps_.push_back(char_split(CharSet::Whitespace, SplitBehavior::Removed));
         p.steps_.push_back(char_split(CharSet::Punctuation, SplitBehavior::Isolated));
       }},
      {"Punctuation",
       [](PreTokenizer& p, const json::Value& v, const std::string& where, const std::string&, int) {
         p.steps_.push_back(char_split(CharSet::Punctuation, behavior_of(v, where)));
       }},
      {"Digits",
       [](PreTokenizer& p, const json::Value& v, const std::string&, const std::string&, int) {
         p.steps_.push_back(char_split(CharSet::Numeric, flag(v, "individual_digits", false) ? SplitBehavior::Isolated
                                                                                               : SplitBehavior::Contiguous));
       }},
      {"CharDelimiterSplit",
       [](PreTokenizer& p, const json::Value& v, const std::string& where, const std::string&, int) {
         Step s = char_split(CharSet::Delimiter, SplitBehavior::Removed);
         const json::Value* d = v.find("delimiter");
         KVPR_CHECK(d && d->is_string(), where, " has no delimiter");
         s.delimiter = single_char(d->as_string(), where + "'s delimiter");
         p.steps_.push_back(s);
       }},
      {"FixedLength",
       [](PreTokenizer& p, const json::Value& v, const std::string&, const std::string&, int) {
         Step s(Kind::FixedLength);
         const json::Value* n = v.find("length");
         s.length = n && n->is_int() && n->as_int() > 0 ? static_cast<size_t>(n->as_int()) : 5;
         p.steps_.push_back(s);
       }},
  };
  return table;
}

bool PreTokenizer::byte_level() const {
  return std::any_of(steps_.begin(), steps_.end(), [](const Step& s) { return s.kind == Kind::ByteLevel; });
}

bool PreTokenizer::prepends_metaspace() const {
  return std::any_of(steps_.begin(), steps_.end(), [](const Step& s) { return s.kind == Kind::Metaspace && s.prepend != 2; });
}

void PreTokenizer::set_add_prefix_space(bool on) {
  for (Step& s : steps_)
    if (s.kind == Kind::ByteLevel) s.add_prefix_space = on;
}

bool PreTokenizer::fast(const Step& s) const {
  return s.fast != Fast::None && (fast_paths_ || !unicode::available());
}

void PreTokenizer::split_fast(const Step& s, std::string_view text, const std::function<void(std::string_view)>& piece) const {
  if (s.fast == Fast::Gpt2) split_gpt2(text, piece);
  else split_llama3(text, s.fast == Fast::Llama3 ? 3 : 1, piece);
}

std::vector<PatternSpan> PreTokenizer::matches(const Step& s, std::string_view text) const {
  if (!fast(s)) return s.pattern.find_matches(text);
  // The hand-written splitters cut all of the text into matches.
  std::vector<PatternSpan> out;
  split_fast(s, text, [&](std::string_view p) {
    const size_t b = static_cast<size_t>(p.data() - text.data());
    out.push_back({b, b + p.size(), true});
  });
  if (out.empty()) out.push_back({0, 0, false});
  return out;
}

void PreTokenizer::run(size_t step, std::string_view text, bool at_start,
                       const std::function<void(std::string_view)>& piece) const {
  if (text.empty()) return;
  if (step == steps_.size()) return piece(text);
  const Step& s = steps_[step];
  auto next = [&](std::string_view part, bool part_at_start) { run(step + 1, part, part_at_start, piece); };
  auto cut = [&](std::string_view t, const std::vector<PatternSpan>& spans, SplitBehavior behavior) {
    for (const auto& [b, e] : apply_behavior(spans, behavior)) next(t.substr(b, e - b), at_start && b == 0);
  };
  switch (s.kind) {
    case Kind::Split: {
      if (s.behavior == SplitBehavior::Isolated) {  // every span a piece, matched or not: streamed
        if (fast(s)) split_fast(s, text, [&](std::string_view p) { next(p, at_start && p.data() == text.data()); });
        else s.pattern.for_each_span(text, [&](const PatternSpan& m) { next(text.substr(m.begin, m.end - m.begin), at_start && m.begin == 0); });
        break;
      }
      std::vector<PatternSpan> spans = matches(s, text);
      if (s.invert)
        for (auto& m : spans) m.match = !m.match;
      cut(text, spans, s.behavior);
      break;
    }
    case Kind::ByteLevel: run_byte_level(step, text, at_start, piece); break;
    case Kind::Metaspace: {
      std::string t = replace_all(text, " ", s.replacement);
      const bool starts = t.compare(0, s.replacement.size(), s.replacement) == 0;
      if (!starts && (s.prepend == 0 || (s.prepend == 1 && at_start))) t.insert(0, s.replacement);
      if (!s.split) return next(t, at_start);
      const char32_t rep = single_char(s.replacement, "Metaspace's replacement");
      cut(t, char_matches(t, [rep](char32_t c) { return c == rep; }), SplitBehavior::MergedWithNext);
      break;
    }
    case Kind::CharSplit: {
      auto pred = [&s](char32_t c) {
        switch (s.chars) {
          case CharSet::Whitespace: return unicode::is_whitespace(c);
          case CharSet::Punctuation: return unicode::is_punctuation(c);
          case CharSet::Numeric: return unicode::is_numeric(c);
          case CharSet::Delimiter: return c == s.delimiter;
        }
        return false;
      };
      cut(text, char_matches(text, pred), s.behavior);
      break;
    }
    case Kind::FixedLength: {
      size_t b = 0, n = 0;
      for (size_t i = 0; i <= text.size();) {
        if (n == s.length || (i == text.size() && i > b)) {
          next(text.substr(b, i - b), at_start && b == 0);
          b = i;
          n = 0;
        }
        if (i == text.size()) break;
        char32_t c;
        i += static_cast<size_t>(std::max(1, utf8_next(text, i, &c)));
        ++n;
      }
      break;
    }
  }
}

// ByteLevel: a space in front (add_prefix_space), GPT-2's pieces (use_regex), each piece's bytes
// mapped to the characters GPT-2's vocabulary spells them with.
void PreTokenizer::run_byte_level(size_t step, std::string_view text, bool at_start,
                                  const std::function<void(std::string_view)>& piece) const {
  const Step& s = steps_[step];
  std::string prefixed;
  if (s.add_prefix_space && text.front() != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed.append(" ").append(text);
    text = prefixed;
  }
  std::string mapped;
  auto map_next = [&](std::string_view part, bool part_at_start) {
    mapped.clear();
    for (unsigned char b : part) mapped += byte_level_char(b);
    run(step + 1, mapped, part_at_start, piece);
  };
  if (!s.use_regex) return map_next(text, at_start);
  if (fast(s)) return split_fast(s, text, [&](std::string_view p) { map_next(p, at_start && p.data() == text.data()); });
  s.pattern.for_each_span(text, [&](const PatternSpan& m) {
    if (m.end > m.begin) map_next(text.substr(m.begin, m.end - m.begin), at_start && m.begin == 0);
  });
}

void PreTokenizer::split(std::string_view text, bool at_start, const std::function<void(std::string_view)>& piece) const {
  run(0, text, at_start, piece);
}

std::vector<std::string> PreTokenizer::split(std::string_view text, bool at_start) const {
  std::vector<std::string> out;
  split(text, at_start, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

}  // namespace kvpr

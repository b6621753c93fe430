#include "engine/text/normalizer.h"

#include "engine/base/error.h"
#include "engine/base/json.h"
#include "engine/base/utf8.h"

namespace kvpr {

namespace {
constexpr int kMaxDepth = 16;     // nested Sequences
constexpr size_t kMaxSteps = 64;  // normalizers in all

bool flag(const json::Value& v, const char* key, bool fallback) {
  const json::Value* f = v.find(key);
  return f && f->is_bool() ? f->as_bool() : fallback;
}

// Calls f(code point, byte offset, byte length) for each character of valid UTF-8.
template <typename F>
void for_each_char(std::string_view s, F&& f) {
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    const int n = utf8_next(s, i, &c);
    KVPR_CHECK(n > 0, "normalizer: invalid UTF-8");
    f(c, i, static_cast<size_t>(n));
    i += static_cast<size_t>(n);
  }
}

std::string strip(std::string_view s, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left) {
    b = s.size();
    for_each_char(s, [&](char32_t c, size_t i, size_t) {
      if (b == s.size() && !unicode::is_whitespace(c)) b = i;
    });
  }
  if (right) {
    size_t last = b;
    for_each_char(s.substr(b), [&](char32_t c, size_t i, size_t n) {
      if (!unicode::is_whitespace(c)) last = b + i + n;
    });
    e = std::max(b, last);
  }
  return std::string(s.substr(b, e - b));
}

template <typename Keep>
std::string filter(std::string_view s, Keep&& keep) {
  std::string out;
  for_each_char(s, [&](char32_t c, size_t i, size_t n) {
    if (keep(c)) out.append(s.substr(i, n));
  });
  return out;
}

// Nmt's control characters removed and its spaces made " " (SentencePiece's nmt_nfkc rules).
std::string nmt(std::string_view s) {
  std::string out;
  for_each_char(s, [&](char32_t c, size_t i, size_t n) {
    if ((c >= 0x1 && c <= 0x8) || c == 0xb || (c >= 0xe && c <= 0x1f) || c == 0x7f || c == 0x8f || c == 0x9f) return;
    if (c == 0x9 || c == 0xa || c == 0xc || c == 0xd || c == 0x1680 || (c >= 0x200b && c <= 0x200f) || c == 0x2028 ||
        c == 0x2029 || c == 0x2581 || c == 0xfeff || c == 0xfffd)
      out.push_back(' ');
    else
      out.append(s.substr(i, n));
  });
  return out;
}

bool is_chinese_char(char32_t c) {
  return (c >= 0x4e00 && c <= 0x9fff) || (c >= 0x3400 && c <= 0x4dbf) || (c >= 0x20000 && c <= 0x2a6df) ||
         (c >= 0x2a700 && c <= 0x2b73f) || (c >= 0x2b740 && c <= 0x2b81f) || (c >= 0x2b920 && c <= 0x2ceaf) ||
         (c >= 0xf900 && c <= 0xfaff) || (c >= 0x2f800 && c <= 0x2fa1f);
}

// BERT's: control characters out, whitespace to " ", CJK ideographs spaced, accents stripped,
// lowercased, each as configured.
std::string bert(std::string_view s, bool clean_text, bool chinese, bool strip_accents, bool lowercase) {
  std::string out(s);
  if (clean_text) {
    std::string t;
    for_each_char(out, [&](char32_t c, size_t i, size_t n) {
      const bool control = c != '\t' && c != '\n' && c != '\r' && unicode::is_other(c);
      if (c == 0 || c == 0xfffd || control) return;
      if (c == '\t' || c == '\n' || c == '\r' || unicode::is_whitespace(c)) t.push_back(' ');
      else t.append(std::string_view(out).substr(i, n));
    });
    out = std::move(t);
  }
  if (chinese) {
    std::string t;
    for_each_char(out, [&](char32_t c, size_t i, size_t n) {
      const bool cjk = is_chinese_char(c);
      if (cjk) t.push_back(' ');
      t.append(std::string_view(out).substr(i, n));
      if (cjk) t.push_back(' ');
    });
    out = std::move(t);
  }
  if (strip_accents) {
    out = unicode::normalize(out, unicode::Form::NFD);
    out = filter(out, [](char32_t c) { return !unicode::is_nonspacing_mark(c); });
  }
  if (lowercase) out = unicode::lowercase(out);
  return out;
}
}  // namespace

Normalizer Normalizer::from_json(const json::Value* v, const std::string& path) {
  Normalizer n;
  if (v && !v->is_null()) n.add(*v, path, 0);
  return n;
}

void Normalizer::add(const json::Value& v, const std::string& path, int depth) {
  KVPR_CHECK(depth < kMaxDepth, path, ": normalizers nested deeper than ", kMaxDepth);
  const json::Value* ty = v.find("type");
  KVPR_CHECK(ty && ty->is_string(), path, ": a normalizer without a type");
  const std::string& type = ty->as_string();
  const std::string where = path + ": the " + type + " normalizer";
  Step s;
  if (type == "Sequence") {
    const json::Value* list = v.find("normalizers");
    KVPR_CHECK(list && list->is_array(), where, " has no list of normalizers");
    for (const auto& e : list->as_array()) add(e, path, depth + 1);
    return;
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    s.kind = Kind::Form;
    s.form = type == "NFC" ? unicode::Form::NFC : type == "NFD" ? unicode::Form::NFD
           : type == "NFKC" ? unicode::Form::NFKC : unicode::Form::NFKD;
  } else if (type == "Lowercase") {
    s.kind = Kind::Lowercase;
  } else if (type == "Strip") {
    s.kind = Kind::Strip;
    s.left = flag(v, "strip_left", true);
    s.right = flag(v, "strip_right", true);
  } else if (type == "StripAccents") {
    s.kind = Kind::StripAccents;
  } else if (type == "Replace") {
    s.kind = Kind::Replace;
    const json::Value* pat = v.find("pattern");
    const json::Value* content = v.find("content");
    KVPR_CHECK(pat && content && content->is_string(), where, " needs a pattern and a content");
    s.pattern = Pattern::from_json(*pat, where);
    s.content = content->as_string();
  } else if (type == "Prepend") {
    s.kind = Kind::Prepend;
    const json::Value* p = v.find("prepend");
    KVPR_CHECK(p && p->is_string(), where, " needs a string to prepend");
    s.content = p->as_string();
  } else if (type == "Nmt") {
    s.kind = Kind::Nmt;
  } else if (type == "BertNormalizer") {
    s.kind = Kind::Bert;
    s.left = flag(v, "clean_text", true);
    s.right = flag(v, "handle_chinese_chars", true);
    s.lowercase = flag(v, "lowercase", true);
    const json::Value* sa = v.find("strip_accents");
    s.strip_accents = sa && sa->is_bool() ? sa->as_bool() : s.lowercase;
  } else {
    KVPR_THROW(where, " is not supported (kvpr has NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, "
               "Replace, Prepend, Nmt, BertNormalizer and Sequence)");
  }
  KVPR_CHECK(steps_.size() < kMaxSteps, path, ": more than ", kMaxSteps, " normalizers");
  KVPR_CHECK(valid_utf8(s.content), where, ": its text is not valid UTF-8");
  KVPR_CHECK(s.kind != Kind::Replace || !s.pattern.source().empty(), where, ": an empty pattern matches everywhere");
  // Unicode forms, case and categories need utf8proc (a Replace's regex, Oniguruma: it says so).
  const bool plain = s.kind == Kind::Prepend || s.kind == Kind::Strip || s.kind == Kind::Replace;
  KVPR_CHECK(plain || unicode::available(), where,
             " needs utf8proc and Oniguruma, and this kvpr was built without them (KVPR_TEXT_LIBS=OFF)");
  steps_.push_back(std::move(s));
}

std::string Normalizer::apply(std::string_view text, bool* stripped_start) const {
  std::string out(text);
  if (stripped_start) *stripped_start = false;
  // What a normalizer may make of a text: NFKD grows a character 18-fold at most; a Replace
  // whose pattern matches nothing but empty strings could grow it without end.
  const size_t cap = 64 * text.size() + 65536;
  for (const Step& s : steps_) {
    KVPR_CHECK(out.size() <= cap, "the normalizer made ", out.size(), " bytes of a ", text.size(), "-byte text");
    switch (s.kind) {
      case Kind::Form:
        out = unicode::normalize(out, s.form);
        break;
      case Kind::Lowercase:
        out = unicode::lowercase(out);
        break;
      case Kind::Strip: {
        char32_t first = 0;
        if (stripped_start && s.left && !out.empty() && utf8_next(out, 0, &first) > 0 && unicode::is_whitespace(first))
          *stripped_start = true;
        out = strip(out, s.left, s.right);
        break;
      }
      case Kind::StripAccents:
        out = filter(out, [](char32_t c) { return !unicode::is_mark(c); });
        break;
      case Kind::Replace: {
        std::string t;
        for (const PatternSpan& m : s.pattern.find_matches(out))
          t.append(m.match ? std::string_view(s.content) : std::string_view(out).substr(m.begin, m.end - m.begin));
        out = std::move(t);
        break;
      }
      case Kind::Prepend:
        if (!out.empty()) out.insert(0, s.content);
        break;
      case Kind::Nmt:
        out = nmt(out);
        break;
      case Kind::Bert:
        out = bert(out, s.left, s.right, s.strip_accents, s.lowercase);
        break;
    }
  }
  return out;
}

}  // namespace kvpr

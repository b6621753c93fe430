#include "engine/text/pattern.h"

#include "engine/base/error.h"
#include "engine/base/json.h"
#include "engine/base/utf8.h"

#ifdef KVPR_HAVE_TEXT_LIBS
#include <dlfcn.h>
#include <oniguruma.h>

#include <mutex>
#endif

namespace kvpr {

namespace {
// Backtracking steps one search may take (Oniguruma's retry limits): a few hundred
// milliseconds of matching, far above what the patterns models ship need on any text.
constexpr unsigned long kRetryLimitInMatch = 20'000'000;
constexpr unsigned long kRetryLimitInSearch = 200'000'000;
}  // namespace

#ifdef KVPR_HAVE_TEXT_LIBS

// Oniguruma, opened privately (RTLD_LOCAL) rather than linked: libonig also exports POSIX's
// regcomp/regexec/regfree with a regex_t of its own, and linked it would take them over for the
// whole process (GoogleTest's death tests broke; anything calling glibc's regex would).
namespace {
struct Onig {
  decltype(&onig_initialize) initialize;
  decltype(&onig_new) compile;
  decltype(&onig_free) free;
  decltype(&onig_region_new) region_new;
  decltype(&onig_region_free) region_free;
  decltype(&onig_region_clear) region_clear;
  decltype(&onig_new_match_param) param_new;
  decltype(&onig_free_match_param) param_free;
  decltype(&onig_initialize_match_param) param_init;
  decltype(&onig_set_retry_limit_in_match_of_match_param) limit_in_match;
  decltype(&onig_set_retry_limit_in_search_of_match_param) limit_in_search;
  decltype(&onig_search_with_param) search;
  int (*error_text)(OnigUChar*, int, ...);
  OnigEncoding utf8;
  OnigSyntaxType* syntax;
};

const Onig& onig() {
  static const Onig o = [] {
    void* lib = nullptr;
    for (const char* name : {"libonig.so.5", "libonig.so"})
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    KVPR_CHECK(lib, "Oniguruma (libonig.so.5) cannot be loaded: install it with scripts/install-deps.sh");
    auto sym = [lib](const char* name) {
      void* f = dlsym(lib, name);
      KVPR_CHECK(f, "Oniguruma's library lacks ", name);
      return f;
    };
    Onig r{};
    r.initialize = reinterpret_cast<decltype(r.initialize)>(sym("onig_initialize"));
    r.compile = reinterpret_cast<decltype(r.compile)>(sym("onig_new"));
    r.free = reinterpret_cast<decltype(r.free)>(sym("onig_free"));
    r.region_new = reinterpret_cast<decltype(r.region_new)>(sym("onig_region_new"));
    r.region_free = reinterpret_cast<decltype(r.region_free)>(sym("onig_region_free"));
    r.region_clear = reinterpret_cast<decltype(r.region_clear)>(sym("onig_region_clear"));
    r.param_new = reinterpret_cast<decltype(r.param_new)>(sym("onig_new_match_param"));
    r.param_free = reinterpret_cast<decltype(r.param_free)>(sym("onig_free_match_param"));
    r.param_init = reinterpret_cast<decltype(r.param_init)>(sym("onig_initialize_match_param"));
    r.limit_in_match = reinterpret_cast<decltype(r.limit_in_match)>(sym("onig_set_retry_limit_in_match_of_match_param"));
    r.limit_in_search = reinterpret_cast<decltype(r.limit_in_search)>(sym("onig_set_retry_limit_in_search_of_match_param"));
    r.search = reinterpret_cast<decltype(r.search)>(sym("onig_search_with_param"));
    r.error_text = reinterpret_cast<decltype(r.error_text)>(sym("onig_error_code_to_str"));
    r.utf8 = static_cast<OnigEncoding>(sym("OnigEncodingUTF8"));
    r.syntax = static_cast<OnigSyntaxType*>(sym("OnigSyntaxOniguruma"));
    OnigEncoding encodings[] = {r.utf8};
    r.initialize(encodings, 1);
    return r;
  }();
  return o;
}

std::string onig_message(int code, OnigErrorInfo* info) {
  OnigUChar buf[ONIG_MAX_ERROR_MESSAGE_LEN];
  const int n = info ? onig().error_text(buf, code, info) : onig().error_text(buf, code);
  return std::string(reinterpret_cast<const char*>(buf), n > 0 ? static_cast<size_t>(n) : 0);
}
}  // namespace

struct Pattern::Compiled {
  regex_t* re = nullptr;
  ~Compiled() {
    if (re) onig().free(re);
  }
};

Pattern Pattern::regex(std::string_view re) {
  const Onig& o = onig();
  auto compiled = std::make_shared<Compiled>();
  OnigErrorInfo info;
  static std::mutex compiling;  // onig_new is not thread-safe (the onig crate locks it too)
  std::lock_guard<std::mutex> lock(compiling);
  const auto* p = reinterpret_cast<const OnigUChar*>(re.data());
  const int r = o.compile(&compiled->re, p, p + re.size(), ONIG_OPTION_NONE, o.utf8, o.syntax, &info);
  KVPR_CHECK(r == ONIG_NORMAL, "the pattern ", re, " does not compile: ", onig_message(r, &info));
  Pattern out;
  out.re_ = std::move(compiled);
  out.source_ = std::string(re);
  return out;
}

void Pattern::for_each_span(std::string_view text, const std::function<void(const PatternSpan&)>& span) const {
  if (text.empty()) return span({0, 0, false});
  if (literal_) return literal_spans(text, span);
  // Oniguruma reads UTF-8 without checking it (its own check would cost a pass per search).
  KVPR_CHECK(valid_utf8(text), "the pattern ", source_, " was given text that is not UTF-8");
  const Onig& o = onig();
  struct Search {
    const Onig& o;
    OnigRegion* region = o.region_new();
    OnigMatchParam* param = o.param_new();
    explicit Search(const Onig& lib) : o(lib) {
      o.param_init(param);
      o.limit_in_match(param, kRetryLimitInMatch);
      o.limit_in_search(param, kRetryLimitInSearch);
    }
    ~Search() {
      o.region_free(region, 1);
      o.param_free(param);
    }
  } s(o);
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* end = str + text.size();
  size_t prev = 0, from = 0;
  bool after_match = false;
  size_t last_match_end = 0;
  // The onig crate's find_iter: search from the last end; an empty match at the end of the
  // previous match is skipped by moving one character on.
  while (from <= text.size()) {
    o.region_clear(s.region);
    const int r = o.search(re_->re, str, end, str + from, end, s.region, ONIG_OPTION_NONE, s.param);
    if (r == ONIG_MISMATCH) break;
    KVPR_CHECK(r >= 0, "the pattern ", source_, " failed on a text of ", text.size(), " bytes: ", onig_message(r, nullptr));
    const size_t b = static_cast<size_t>(s.region->beg[0]), e = static_cast<size_t>(s.region->end[0]);
    if (b == e && after_match && last_match_end == e) {
      if (from >= text.size()) break;
      char32_t cp;
      const int n = utf8_next(text, from, &cp);
      from += n > 0 ? static_cast<size_t>(n) : 1;
      continue;
    }
    from = e;
    after_match = true;
    last_match_end = e;
    if (prev != b) span({prev, b, false});
    span({b, e, true});
    prev = e;
  }
  if (prev != text.size()) span({prev, text.size(), false});
}

#else

struct Pattern::Compiled {};

Pattern Pattern::regex(std::string_view re) {
  KVPR_THROW("the pattern ", re, " needs Oniguruma, and this kvpr was built without it (KVPR_TEXT_LIBS=OFF): "
             "rebuild after scripts/install-deps.sh");
}

void Pattern::for_each_span(std::string_view text, const std::function<void(const PatternSpan&)>& span) const {
  if (text.empty()) return span({0, 0, false});
  literal_spans(text, span);
}

#endif

Pattern Pattern::literal(std::string_view s) {
  // Hugging Face escapes a String pattern and has Oniguruma find it: a non-empty one is found
  // as plainly, left to right without overlaps. An empty one matches everywhere, as a regex.
  if (s.empty()) return regex("");
  Pattern p;
  p.source_ = std::string(s);
  p.literal_ = true;
  return p;
}

void Pattern::literal_spans(std::string_view text, const std::function<void(const PatternSpan&)>& span) const {
  size_t prev = 0;
  for (size_t at = text.find(source_); at != std::string_view::npos; at = text.find(source_, prev)) {
    if (at > prev) span({prev, at, false});
    span({at, at + source_.size(), true});
    prev = at + source_.size();
  }
  if (prev < text.size()) span({prev, text.size(), false});
}

std::vector<PatternSpan> Pattern::find_matches(std::string_view text) const {
  std::vector<PatternSpan> out;
  for_each_span(text, [&](const PatternSpan& m) { out.push_back(m); });
  return out;
}

Pattern Pattern::from_json(const json::Value& v, const std::string& where) {
  if (const json::Value* s = v.find("String"); s && s->is_string()) return literal(s->as_string());
  if (const json::Value* r = v.find("Regex"); r && r->is_string()) return regex(r->as_string());
  KVPR_THROW(where, ": a pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

}  // namespace kvpr

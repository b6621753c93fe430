#include "jinja/lexer.h"

#include <cctype>
#include <cstring>

#include "engine/base/error.h"
#include "engine/base/utf8.h"

namespace kvpr::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// jinja2's newline_re (\r\n, \r, \n) split, then "\n".join(): one trailing newline goes.
std::string normalize_newlines(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size();) {
    if (src[i] == '\r') {
      out.push_back('\n');
      i += i + 1 < src.size() && src[i + 1] == '\n' ? 2 : 1;
    } else {
      out.push_back(src[i++]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : s_(normalize_newlines(source)) {}

  std::vector<Token> run() {
    while (pos_ < s_.size()) {
      const size_t p = next_tag(pos_);
      std::string text = s_.substr(pos_, p - pos_);
      if (p == s_.size()) {
        emit_text(std::move(text));
        pos_ = p;
        break;
      }
      const char kind = s_[p + 1];
      size_t q = p + 2;
      const char sign = q < s_.size() && (s_[q] == '-' || s_[q] == '+') ? s_[q] : 0;
      if (sign) ++q;
      if (sign == '-') {
        text = rstrip(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: only whitespace between the line's start and the tag.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting_) && l_pos < text.size() && all_space(text, l_pos)) text.resize(l_pos);
      }
      emit_text(std::move(text));
      count_lines(pos_, q);
      pos_ = q;
      if (kind == '#') comment();
      else if (kind == '{') tag(Token::Kind::VarBegin, Token::Kind::VarEnd, "}}");
      else if (raw_follows()) raw();
      else tag(Token::Kind::BlockBegin, Token::Kind::BlockEnd, "%}");
    }
    out_.push_back({Token::Kind::End, "", Value(), line_});
    return std::move(out_);
  }

 private:
  size_t next_tag(size_t from) const {
    for (size_t i = from; i + 1 < s_.size(); ++i)
      if (s_[i] == '{' && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    return s_.size();
  }
  static std::string rstrip(const std::string& t) {
    size_t e = t.size();
    while (e > 0 && is_space(t[e - 1])) --e;
    return t.substr(0, e);
  }
  static bool all_space(const std::string& t, size_t from) {
    for (size_t i = from; i < t.size(); ++i)
      if (!is_space(t[i])) return false;
    return true;
  }
  void count_lines(size_t a, size_t b) {
    for (size_t i = a; i < b && i < s_.size(); ++i)
      if (s_[i] == '\n') ++line_;
  }
  void emit_text(std::string text) {
    if (!text.empty()) out_.push_back({Token::Kind::Text, std::move(text), Value(), line_});
  }
  [[noreturn]] void fail(const std::string& what) const { KVPR_THROW("line ", line_, ": ", what); }

  // After a tag's end: "-" took the whitespace after it; else trim_blocks takes one newline
  // after a block or comment tag unless "+" asked not to.
  void after_end(bool strip, bool plus, bool block) {
    const size_t start = pos_;
    if (strip) {
      while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
    } else if (block && !plus && pos_ < s_.size() && s_[pos_] == '\n') {
      ++pos_;
    }
    count_lines(start, pos_);
    line_starting_ = pos_ > 0 && s_[pos_ - 1] == '\n' && pos_ > start;
  }

  void comment() {
    const size_t e = s_.find("#}", pos_);
    if (e == std::string::npos) fail("a comment is not closed");
    const bool strip = e > pos_ && s_[e - 1] == '-', plus = e > pos_ && s_[e - 1] == '+';
    count_lines(pos_, e + 2);
    pos_ = e + 2;
    after_end(strip, plus, true);
  }

  bool raw_follows() const {
    size_t i = pos_;
    while (i < s_.size() && is_space(s_[i])) ++i;
    if (s_.compare(i, 3, "raw") != 0) return false;
    i += 3;
    while (i < s_.size() && is_space(s_[i])) ++i;
    return s_.compare(i, 2, "%}") == 0 || s_.compare(i, 3, "-%}") == 0 || s_.compare(i, 3, "+%}") == 0;
  }

  void raw() {
    size_t i = s_.find("%}", pos_);
    const bool strip_open = s_[i - 1] == '-', plus_open = s_[i - 1] == '+';
    count_lines(pos_, i + 2);
    pos_ = i + 2;
    after_end(strip_open, plus_open, false);  // trim_blocks is endraw's, not raw's
    // The first "{%[-+] endraw [-+]%}" ends it.
    for (size_t at = pos_;; ++at) {
      at = s_.find("{%", at);
      if (at == std::string::npos) fail("a raw block is not closed (endraw)");
      size_t j = at + 2;
      const char sign = j < s_.size() && (s_[j] == '-' || s_[j] == '+') ? s_[j] : 0;
      if (sign) ++j;
      while (j < s_.size() && is_space(s_[j])) ++j;
      if (s_.compare(j, 6, "endraw") != 0) continue;
      j += 6;
      while (j < s_.size() && is_space(s_[j])) ++j;
      const char end_sign = j < s_.size() && (s_[j] == '-' || s_[j] == '+') ? s_[j] : 0;
      if (end_sign) ++j;
      if (s_.compare(j, 2, "%}") != 0) continue;
      std::string text = s_.substr(pos_, at - pos_);
      if (sign == '-') text = rstrip(text);
      else if (sign != '+') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting_) && l_pos < text.size() && all_space(text, l_pos)) text.resize(l_pos);
      }
      emit_text(std::move(text));
      count_lines(pos_, j + 2);
      pos_ = j + 2;
      after_end(end_sign == '-', end_sign == '+', true);
      return;
    }
  }

  // The tokens of one {{ }} or {% %} up to its end.
  void tag(Token::Kind begin, Token::Kind end, const char* closer) {
    out_.push_back({begin, "", Value(), line_});
    const bool block = begin == Token::Kind::BlockBegin;
    int open = 0;  // brackets open: an end tag inside them is not one (jinja2's lexer)
    while (true) {
      while (pos_ < s_.size() && is_space(s_[pos_])) {
        if (s_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= s_.size()) fail(std::string("a tag is not closed (") + closer + ")");
      const char c = s_[pos_];
      if (open == 0 && (c == '-' || c == '+') && s_.compare(pos_ + 1, 2, closer) == 0) {
        if (c == '+' && !block) fail("'+' before '}}'");
        pos_ += 3;
        out_.push_back({end, "", Value(), line_});
        after_end(c == '-', c == '+', block);
        return;
      }
      if (open == 0 && s_.compare(pos_, 2, closer) == 0) {
        pos_ += 2;
        out_.push_back({end, "", Value(), line_});
        after_end(false, false, block);
        return;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
        out_.push_back({Token::Kind::Name, s_.substr(pos_, e - pos_), Value(), line_});
        pos_ = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        number();
      } else if (c == '\'' || c == '"') {
        string_literal(c);
      } else {
        op();
        const char o = out_.back().text[0];
        if (out_.back().text.size() == 1 && (o == '(' || o == '[' || o == '{')) ++open;
        if (out_.back().text.size() == 1 && (o == ')' || o == ']' || o == '}') && open > 0) --open;
      }
    }
  }

  void number() {
    size_t e = pos_;
    bool is_float = false;
    std::string digits;
    auto run = [&] {
      while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_'))
        if (s_[e++] != '_') digits.push_back(s_[e - 1]);
    };
    run();
    if (e + 1 < s_.size() && s_[e] == '.' && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
      is_float = true;
      digits.push_back(s_[e++]);
      run();
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t k = e + 1;
      if (k < s_.size() && (s_[k] == '+' || s_[k] == '-')) ++k;
      if (k < s_.size() && std::isdigit(static_cast<unsigned char>(s_[k]))) {
        is_float = true;
        digits.append(s_, e, k - e);
        e = k;
        run();
      }
    }
    Token t{is_float ? Token::Kind::Float : Token::Kind::Int, digits, Value(), line_};
    try {
      t.number = is_float ? Value(std::stod(digits)) : Value(static_cast<int64_t>(std::stoll(digits)));
    } catch (const std::exception&) {
      fail("number " + digits + " out of range");
    }
    out_.push_back(std::move(t));
    pos_ = e;
  }

  // Python's unicode-escape decoding of a string literal's body.
  void string_literal(char quote) {
    std::string v;
    size_t i = pos_ + 1;
    const int line = line_;
    while (true) {
      if (i >= s_.size()) fail("a string is not closed");
      const char c = s_[i];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\' || i + 1 >= s_.size()) {
        v.push_back(c);
        ++i;
        continue;
      }
      const char e = s_[i + 1];
      i += 2;
      auto hex = [&](int n) {
        if (i + static_cast<size_t>(n) > s_.size()) fail("a bad \\x, \\u or \\U escape");
        uint32_t cp = 0;
        for (int k = 0; k < n; ++k) {
          const char h = s_[i + static_cast<size_t>(k)];
          if (!std::isxdigit(static_cast<unsigned char>(h))) fail("a bad \\x, \\u or \\U escape");
          cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        i += static_cast<size_t>(n);
        append_utf8(v, cp);
      };
      switch (e) {
        case 'n': v.push_back('\n'); break;
        case 't': v.push_back('\t'); break;
        case 'r': v.push_back('\r'); break;
        case 'a': v.push_back('\a'); break;
        case 'b': v.push_back('\b'); break;
        case 'f': v.push_back('\f'); break;
        case 'v': v.push_back('\v'); break;
        case '\\': v.push_back('\\'); break;
        case '\'': v.push_back('\''); break;
        case '"': v.push_back('"'); break;
        case '\n': ++line_; break;  // a backslash before a newline: both go
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i < s_.size() && s_[i] >= '0' && s_[i] <= '7'; ++k) cp = cp * 8 + static_cast<uint32_t>(s_[i++] - '0');
            append_utf8(v, cp);
          } else {
            v.push_back('\\');
            v.push_back(e);
          }
      }
    }
    out_.push_back({Token::Kind::String, std::move(v), Value(), line});
    pos_ = i + 1;
  }

  void op() {
    static const char* const two[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* t : two)
      if (s_.compare(pos_, 2, t) == 0) {
        out_.push_back({Token::Kind::Op, t, Value(), line_});
        pos_ += 2;
        return;
      }
    const char c = s_[pos_];
    if (!std::strchr("+-*/%~()[]{},.:|=<>", c)) fail(std::string("unexpected character '") + c + "'");
    out_.push_back({Token::Kind::Op, std::string(1, c), Value(), line_});
    ++pos_;
  }

  std::string s_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> lex(const std::string& source) { return Lexer(source).run(); }

}  // namespace kvpr::jinja

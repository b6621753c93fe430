// The lexer and parser of openai/jinja.h; jinja_eval.cc runs what they build.
//
// Lexing follows jinja2's with trim_blocks and lstrip_blocks (as transformers configures it):
// the source's newlines are normalised as str.splitlines() then "\n".join() does (so one
// trailing newline goes); "{%-"/"-%}" (and {{ }}, {# #}) strip all whitespace on their side;
// a block or comment tag that only whitespace precedes on its line takes that whitespace away
// (not with "{%+"); the newline right after a block or comment tag goes (not with "+%}").
#include "openai/jinja.h"

#include <cctype>
#include <cstring>

#include "engine/base/error.h"
#include "engine/base/utf8.h"
#include "openai/jinja_ast.h"

namespace kvpr::jinja {

namespace {

struct Token {
  enum class Kind { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };
  Kind kind;
  std::string text;  // Text, Name, String (decoded), Op
  Value number;
  int line = 0;
};

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

// ---------------------------------------------------------------------------------- parser

class Parser {
 public:
  Parser(std::vector<Token> tokens, const Limits& limits) : t_(std::move(tokens)), limits_(limits) {}

  std::unique_ptr<Node> run() {
    auto root = std::make_unique<Node>();
    root->kind = Node::Kind::Root;
    std::string end;
    root->body = body({}, &end);
    return root;
  }

 private:
  // A guard for the source's nesting.
  struct Deeper {
    Parser& p;
    explicit Deeper(Parser& parser) : p(parser) {
      if (++p.depth_ > p.limits_.max_depth) p.fail("nested deeper than " + std::to_string(p.limits_.max_depth));
    }
    ~Deeper() { --p.depth_; }
  };

  // One more link of a left-deep chain (a ~ b ~ c, x | f | g, a.b.c, f()()): chains count
  // towards the depth limit too, since evaluating them recurses as deep.
  void link(int& n) {
    if (++n + depth_ > limits_.max_depth) fail("nested deeper than " + std::to_string(limits_.max_depth));
  }
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  [[noreturn]] void fail(const std::string& what) const { KVPR_THROW("line ", cur().line, ": ", what); }
  bool is_op(const char* op) const { return cur().kind == Token::Kind::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().kind == Token::Kind::Name && cur().text == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()));
    ++i_;
  }
  std::string expect_name() {
    if (cur().kind != Token::Kind::Name) fail("expected a name, got " + describe(cur()));
    return t_[i_++].text;
  }
  void expect_block_end() {
    if (cur().kind != Token::Kind::BlockEnd) fail("expected the end of the tag, got " + describe(cur()));
    ++i_;
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Token::Kind::Text: return "text";
      case Token::Kind::VarBegin: return "'{{'";
      case Token::Kind::VarEnd: return "'}}'";
      case Token::Kind::BlockBegin: return "'{%'";
      case Token::Kind::BlockEnd: return "'%}'";
      case Token::Kind::End: return "the end of the template";
      case Token::Kind::String: return "a string";
      default: return "'" + t.text + "'";
    }
  }
  ExprPtr make(Expr::Kind k) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = cur().line;
    return e;
  }
  NodePtr node(Node::Kind k, int line) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = line;
    return n;
  }

  // Statements up to a block tag whose keyword is in `ends` (left in *end, its tag's name
  // consumed but not its end), or the template's end when `ends` is empty.
  Body body(const std::vector<std::string>& ends, std::string* end) {
    Deeper d(*this);
    Body out;
    while (true) {
      const Token& t = cur();
      if (t.kind == Token::Kind::End) {
        if (!ends.empty()) fail("the template ends before " + ends.back());
        return out;
      }
      if (t.kind == Token::Kind::Text) {
        auto n = node(Node::Kind::Text, t.line);
        n->text = t.text;
        out.push_back(std::move(n));
        ++i_;
      } else if (t.kind == Token::Kind::VarBegin) {
        auto n = node(Node::Kind::Output, t.line);
        ++i_;
        n->expr = expression();
        if (cur().kind != Token::Kind::VarEnd) fail("expected '}}', got " + describe(cur()));
        ++i_;
        out.push_back(std::move(n));
      } else if (t.kind == Token::Kind::BlockBegin) {
        ++i_;
        const std::string kw = cur().kind == Token::Kind::Name ? cur().text : "";
        for (const auto& e : ends)
          if (kw == e) {
            ++i_;
            *end = kw;
            return out;
          }
        out.push_back(statement());
      } else {
        fail("unexpected " + describe(t));
      }
    }
  }

  NodePtr statement() {
    const int line = cur().line;
    const std::string kw = expect_name();
    if (kw == "if") return if_statement(line);
    if (kw == "for") return for_statement(line);
    if (kw == "set") return set_statement(line);
    if (kw == "macro") return macro_statement(line);
    if (kw == "call") return call_statement(line);
    if (kw == "filter") {
      auto n = node(Node::Kind::FilterBlock, line);
      n->filters = filter_chain();
      expect_block_end();
      std::string end;
      n->body = body({"endfilter"}, &end);
      expect_block_end();
      return n;
    }
    if (kw == "generation") {  // transformers' AssistantTracker: the body as it is
      expect_block_end();
      auto n = node(Node::Kind::FilterBlock, line);
      std::string end;
      n->body = body({"endgeneration"}, &end);
      expect_block_end();
      return n;
    }
    if (kw == "break" || kw == "continue") {
      if (loops_ == 0) fail("'" + kw + "' outside a loop");
      expect_block_end();
      return node(kw == "break" ? Node::Kind::Break : Node::Kind::Continue, line);
    }
    fail("the tag '" + kw + "' is not supported (" +
         (kw == "include" || kw == "import" || kw == "from" || kw == "extends" || kw == "block"
              ? "a chat template is one template"
              : "kvpr knows for, if, set, macro, call, filter, raw, generation, break, continue") +
         ")");
  }

  NodePtr if_statement(int line) {
    auto n = node(Node::Kind::If, line);
    ExprPtr cond = expression();
    expect_block_end();
    // Inside an if, jinja2 leaves an unknown filter or test to fail when it runs (a template
    // may guard it with `is filter`).
    ++conditional_;
    struct Leave {
      int& c;
      ~Leave() { --c; }
    } leave{conditional_};
    while (true) {
      std::string end;
      Body b = body({"elif", "else", "endif"}, &end);
      n->branches.emplace_back(std::move(cond), std::move(b));
      if (end == "endif") break;
      if (end == "else") {
        expect_block_end();
        Body e = body({"endif"}, &end);
        n->branches.emplace_back(nullptr, std::move(e));
        break;
      }
      cond = expression();
      expect_block_end();
    }
    expect_block_end();
    return n;
  }

  std::vector<std::string> targets() {
    std::vector<std::string> out;
    const bool paren = is_op("(");
    if (paren) ++i_;
    out.push_back(expect_name());
    while (is_op(",")) {
      ++i_;
      out.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return out;
  }

  NodePtr for_statement(int line) {
    auto n = node(Node::Kind::For, line);
    n->targets = targets();
    if (!is_name("in")) fail("expected 'in' in the for loop");
    ++i_;
    n->expr = or_expression();  // an `if` here filters the items (not a conditional expression)
    if (is_name("if")) {
      ++i_;
      n->cond = expression();
    }
    if (is_name("recursive")) fail("recursive loops are not supported");
    expect_block_end();
    ++loops_;
    std::string end;
    n->body = body({"else", "endfor"}, &end);
    --loops_;
    if (end == "else") {
      expect_block_end();
      n->else_body = body({"endfor"}, &end);
    }
    expect_block_end();
    return n;
  }

  NodePtr set_statement(int line) {
    std::string name = expect_name();
    if (is_op(".")) {  // namespace attribute
      ++i_;
      auto n = node(Node::Kind::Set, line);
      n->text = name;
      n->attr = expect_name();
      expect_op("=");
      n->expr = expression();
      expect_block_end();
      return n;
    }
    std::vector<std::string> names{name};
    while (is_op(",")) {
      ++i_;
      names.push_back(expect_name());
    }
    if (is_op("=")) {
      ++i_;
      auto n = node(Node::Kind::Set, line);
      n->targets = std::move(names);
      n->expr = tuple_expression();
      expect_block_end();
      return n;
    }
    if (names.size() != 1) fail("a set block takes one name");
    auto n = node(Node::Kind::SetBlock, line);
    n->text = name;
    if (is_op("|")) n->filters = filter_chain();
    expect_block_end();
    std::string end;
    n->body = body({"endset"}, &end);
    expect_block_end();
    return n;
  }

  std::vector<std::pair<std::string, ExprPtr>> params() {
    std::vector<std::pair<std::string, ExprPtr>> out;
    expect_op("(");
    while (!is_op(")")) {
      std::string name = expect_name();
      ExprPtr def;
      if (is_op("=")) {
        ++i_;
        def = expression();
      }
      out.emplace_back(std::move(name), std::move(def));
      if (!is_op(",")) break;
      ++i_;
    }
    expect_op(")");
    return out;
  }

  NodePtr macro_statement(int line) {
    auto n = node(Node::Kind::Macro, line);
    n->text = expect_name();
    n->params = params();
    expect_block_end();
    const int loops = loops_;
    loops_ = 0;
    std::string end;
    n->body = body({"endmacro"}, &end);
    loops_ = loops;
    if (cur().kind == Token::Kind::Name) ++i_;  // {% endmacro name %}
    expect_block_end();
    return n;
  }

  NodePtr call_statement(int line) {
    auto n = node(Node::Kind::CallBlock, line);
    if (is_op("(")) n->params = params();
    n->expr = expression();
    if (n->expr->kind != Expr::Kind::Call) fail("a call block calls a macro");
    expect_block_end();
    std::string end;
    n->body = body({"endcall"}, &end);
    expect_block_end();
    return n;
  }

  // | f | g(args) ... on a null value (filter blocks, set blocks).
  std::vector<ExprPtr> filter_chain() {
    std::vector<ExprPtr> out;
    if (is_op("|")) ++i_;
    while (true) {
      out.push_back(filter(nullptr));
      if (!is_op("|")) break;
      ++i_;
    }
    return out;
  }

  // ---------------------------------------------------------------- expressions

  // An expression, or several separated by commas: a tuple (set a, b = 1, 2).
  ExprPtr tuple_expression() {
    ExprPtr first = expression();
    if (!is_op(",")) return first;
    auto t = make(Expr::Kind::ListLiteral);
    t->negated = true;  // a tuple
    t->items.push_back(std::move(first));
    while (is_op(",")) {
      ++i_;
      t->items.push_back(expression());
    }
    return t;
  }

  ExprPtr expression() {
    Deeper d(*this);
    ExprPtr e = or_expression();
    if (is_name("if")) {
      auto c = make(Expr::Kind::Cond);
      ++i_;
      c->a = std::move(e);
      c->b = or_expression();
      if (is_name("else")) {
        ++i_;
        c->c = expression();
      }
      return c;
    }
    return e;
  }

  // left (word right)*: "or" over "and" expressions, "and" over "not" ones.
  template <typename Next>
  ExprPtr left_assoc(const char* word, Expr::Kind kind, Next next) {
    ExprPtr e = (this->*next)();
    int links = 0;
    while (is_name(word)) {
      link(links);
      auto o = make(kind);
      ++i_;
      o->a = std::move(e);
      o->b = (this->*next)();
      e = std::move(o);
    }
    return e;
  }
  ExprPtr or_expression() { return left_assoc("or", Expr::Kind::Or, &Parser::and_expression); }
  ExprPtr and_expression() { return left_assoc("and", Expr::Kind::And, &Parser::not_expression); }
  ExprPtr not_expression() {
    if (is_name("not")) {
      Deeper d(*this);
      auto n = make(Expr::Kind::Not);
      ++i_;
      n->a = not_expression();
      return n;
    }
    return compare();
  }
  ExprPtr compare() {
    ExprPtr e = math1();
    ExprPtr cmp;
    int links = 0;
    while (true) {
      std::string op;
      if (cur().kind == Token::Kind::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" || cur().text == ">" ||
           cur().text == ">=")) {
        op = cur().text;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().kind == Token::Kind::Name && peek().text == "in") {
        op = "notin";
        i_ += 2;
      } else {
        break;
      }
      link(links);
      if (!cmp) {
        cmp = make(Expr::Kind::Compare);
        cmp->a = std::move(e);
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(math1());
    }
    return cmp ? std::move(cmp) : std::move(e);
  }
  ExprPtr binary(ExprPtr a, const std::string& op, ExprPtr b) {
    auto e = make(Expr::Kind::Binary);
    e->name = op;
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }
  ExprPtr math1() {
    ExprPtr e = concat();
    int links = 0;
    while (is_op("+") || is_op("-")) {
      link(links);
      const std::string op = t_[i_++].text;
      e = binary(std::move(e), op, concat());
    }
    return e;
  }
  ExprPtr concat() {
    ExprPtr e = math2();
    int links = 0;
    while (is_op("~")) {
      link(links);
      ++i_;
      e = binary(std::move(e), "~", math2());
    }
    return e;
  }
  ExprPtr math2() {
    ExprPtr e = power();
    int links = 0;
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      link(links);
      const std::string op = t_[i_++].text;
      e = binary(std::move(e), op, power());
    }
    return e;
  }
  ExprPtr power() {
    ExprPtr e = unary(true);
    int links = 0;
    while (is_op("**")) {
      link(links);
      ++i_;
      e = binary(std::move(e), "**", unary(true));
    }
    return e;
  }
  ExprPtr unary(bool with_filter) {
    Deeper d(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make(is_op("-") ? Expr::Kind::Neg : Expr::Kind::Pos);
      ++i_;
      e->a = unary(false);
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    if (with_filter) e = filters_and_tests(std::move(e));
    return e;
  }

  ExprPtr primary() {
    const Token& t = cur();
    if (t.kind == Token::Kind::Name) {
      auto e = make(Expr::Kind::Literal);
      const std::string& n = t.text;
      if (n == "true" || n == "True") e->value = Value(true);
      else if (n == "false" || n == "False") e->value = Value(false);
      else if (n == "none" || n == "None") e->value = Value::none();
      else {
        e->kind = Expr::Kind::Name;
        e->name = n;
      }
      ++i_;
      return e;
    }
    if (t.kind == Token::Kind::String) {
      auto e = make(Expr::Kind::Literal);
      std::string s;
      while (cur().kind == Token::Kind::String) s += t_[i_++].text;  // adjacent literals join
      e->value = Value(std::move(s));
      return e;
    }
    if (t.kind == Token::Kind::Int || t.kind == Token::Kind::Float) {
      auto e = make(Expr::Kind::Literal);
      e->value = t.number;
      ++i_;
      return e;
    }
    if (is_op("(")) {
      ++i_;
      if (is_op(")")) {  // the empty tuple
        ++i_;
        auto empty = make(Expr::Kind::ListLiteral);
        empty->negated = true;
        return empty;
      }
      ExprPtr first = expression();
      if (!is_op(",")) {
        expect_op(")");
        return first;
      }
      ExprPtr tuple = list_until(")", std::move(first));
      tuple->negated = true;
      return tuple;
    }
    if (is_op("[")) {
      ++i_;
      return list_until("]", nullptr);
    }
    if (is_op("{")) {
      auto d = make(Expr::Kind::DictLiteral);
      ++i_;
      while (!is_op("}")) {
        d->items.push_back(expression());
        expect_op(":");
        d->items.push_back(expression());
        if (!is_op(",")) break;
        ++i_;
      }
      expect_op("}");
      return d;
    }
    fail("unexpected " + describe(t));
  }

  // Items separated by commas up to `close` (after `first`, when given; a trailing comma
  // allowed): a list literal, or a tuple's items.
  ExprPtr list_until(const char* close, ExprPtr first) {
    auto l = make(Expr::Kind::ListLiteral);
    if (first) l->items.push_back(std::move(first));
    while (!is_op(close)) {
      if (!l->items.empty()) {
        expect_op(",");
        if (is_op(close)) break;
      }
      l->items.push_back(expression());
    }
    expect_op(close);
    return l;
  }

  void call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().kind == Token::Kind::Name && peek().kind == Token::Kind::Op && peek().text == "=") {
        std::string k = t_[i_].text;
        i_ += 2;
        e.kwargs.emplace_back(std::move(k), expression());
      } else {
        if (!e.kwargs.empty()) fail("a positional argument after a keyword one");
        e.items.push_back(expression());
      }
      if (!is_op(",")) break;
      ++i_;
    }
    expect_op(")");
  }

  ExprPtr postfix(ExprPtr e) {
    int links = 0;
    while (true) {
      link(links);
      if (is_op(".")) {
        ++i_;
        auto a = make(Expr::Kind::Attr);
        if (cur().kind == Token::Kind::Int) {  // foo.0 is foo[0]
          a->kind = Expr::Kind::Item;
          auto idx = make(Expr::Kind::Literal);
          idx->value = cur().number;
          ++i_;
          a->b = std::move(idx);
        } else {
          a->name = expect_name();
        }
        a->a = std::move(e);
        e = std::move(a);
      } else if (is_op("[")) {
        ++i_;
        auto it = make(Expr::Kind::Item);
        it->a = std::move(e);
        std::vector<ExprPtr> parts(1);
        bool slice = false;
        if (!is_op(":")) parts[0] = expression();
        while (is_op(":") && parts.size() < 3) {
          slice = true;
          ++i_;
          parts.emplace_back();
          if (!is_op(":") && !is_op("]")) parts.back() = expression();
        }
        expect_op("]");
        if (slice) {
          it->kind = Expr::Kind::Slice;
          it->items = std::move(parts);
        } else {
          it->b = std::move(parts[0]);
        }
        e = std::move(it);
      } else if (is_op("(")) {
        auto c = make(Expr::Kind::Call);
        c->a = std::move(e);
        call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr filter(ExprPtr a) {
    auto f = make(Expr::Kind::Filter);
    f->name = expect_name();
    while (is_op(".")) {  // dotted filter names are not builtin ones
      ++i_;
      f->name += "." + expect_name();
    }
    if (!known_filter(f->name) && conditional_ == 0) fail("no filter named '" + f->name + "'");
    f->a = std::move(a);
    if (is_op("(")) call_args(*f);
    return f;
  }

  ExprPtr filters_and_tests(ExprPtr e) {
    int links = 0;
    while (true) {
      link(links);
      if (is_op("|")) {
        ++i_;
        e = filter(std::move(e));
      } else if (is_name("is")) {
        ++i_;
        auto t = make(Expr::Kind::Test);
        if (is_name("not")) {
          t->negated = true;
          ++i_;
        }
        t->name = cur().kind == Token::Kind::Name ? expect_name() : t_[i_++].text;  // "is ==", "is none"
        if (!known_test(t->name) && conditional_ == 0) fail("no test named '" + t->name + "'");
        t->a = std::move(e);
        if (is_op("(")) {
          call_args(*t);
        } else if (cur().kind == Token::Kind::String || cur().kind == Token::Kind::Int ||
                   cur().kind == Token::Kind::Float || is_op("[") || is_op("{") ||
                   (cur().kind == Token::Kind::Name && !is_name("else") && !is_name("or") && !is_name("and") &&
                    !is_name("if") && !is_name("in") && !is_name("not") && !is_name("is"))) {
          t->items.push_back(postfix(primary()));  // `is divisibleby 3`, `is sameas none`
        }
        e = std::move(t);
      } else if (is_op("(")) {
        auto c = make(Expr::Kind::Call);
        c->a = std::move(e);
        call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  const Limits& limits_;
  int depth_ = 0;
  int loops_ = 0;
  int conditional_ = 0;
};

}  // namespace

Template::Template(const std::string& source, Limits limits) : limits_(limits) {
  root_ = Parser(Lexer(source).run(), limits_).run();
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

}  // namespace kvpr::jinja

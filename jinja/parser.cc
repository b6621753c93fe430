// The Jinja parser: a template's tokens (lexer.h) as the statements and expressions of ast.h,
// which renderer.cc runs.
#include "jinja/jinja.h"

#include <cctype>
#include <cstring>

#include "engine/base/error.h"
#include "engine/base/utf8.h"
#include "jinja/ast.h"
#include "jinja/builtins.h"
#include "jinja/lexer.h"

namespace kvpr::jinja {

namespace {


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

  // `callee(args)`, at its "(".
  ExprPtr call_of(ExprPtr callee) {
    auto c = make(Expr::Kind::Call);
    c->a = std::move(callee);
    call_args(*c);
    return c;
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
        e = call_of(std::move(e));
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
        e = call_of(std::move(e));
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
  root_ = Parser(lex(source), limits_).run();
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

}  // namespace kvpr::jinja

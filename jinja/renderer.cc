// The interpreter of jinja/jinja.h: runs what parser.cc built, with jinja2's scoping (a for
// loop's iterations and a macro's body each have their own variables; a macro sees the
// template's top-level ones, not its caller's) and Python's operators; the filters, tests,
// methods and globals it calls by name are builtins.h's.
#include <algorithm>
#include <cmath>
#include <utility>

#include "engine/base/error.h"
#include "engine/base/utf8.h"
#include "jinja/ast.h"
#include "jinja/builtins.h"
#include "jinja/jinja.h"
#include "jinja/text.h"

namespace kvpr::jinja {

namespace {

enum class Flow { Normal, Break, Continue };

// Items one list may hold, and how deeply lists and dicts may nest (what the printers and
// comparisons recurse over).
constexpr size_t kMaxItems = 1u << 20;
constexpr int kMaxNesting = 256;

class Renderer final : public RenderContext {
 public:
  Renderer(const Limits& limits, const Value& context) : limits_(limits) {
    globals_ = globals(*this);
    if (context.is_dict())
      for (const auto& [k, v] : context.as_dict()) globals_[k] = v;
    scopes_ = {&globals_, &top_};
  }
  // A namespace may hold itself (ns.s = ns) or a caller: emptied here, so no cycle outlives the render.
  ~Renderer() {
    for (auto& ns : namespaces_) ns.namespace_dict().clear();
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  std::string run(const Node& root) {
    std::string out;
    exec_body(root.body, out);
    return out;
  }

  const Limits& limits() const override { return limits_; }
  void add_steps(int64_t n) override { steps_ += n; }
  Value keep_namespace(Value ns) override {
    namespaces_.push_back(ns);
    return ns;
  }

 private:
  void step(int line) {
    if (++steps_ > limits_.max_steps)
      fail(line, "the template ran past its budget of " + std::to_string(limits_.max_steps) + " steps");
  }
  void emit(std::string& out, const std::string& s, int line) {
    out += s;
    if (out.size() > limits_.max_output)
      fail(line, "the template wrote more than " + std::to_string(limits_.max_output) + " bytes");
  }

  // ------------------------------------------------------------------ variables

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = (*it)->find(name);
      if (f != (*it)->end()) return f->second;
    }
    return Value::undefined("'" + name + "' is undefined");
  }
  void assign(const std::string& name, Value v) { (*scopes_.back())[name] = std::move(v); }

  // ------------------------------------------------------------------ statements

  Flow exec_body(const Body& body, std::string& out) {
    for (const auto& n : body) {
      const Flow f = exec(*n, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(const Node& n, std::string& out) {
    step(n.line);
    switch (n.kind) {
      case Node::Kind::Root: return exec_body(n.body, out);
      case Node::Kind::Text: emit(out, n.text, n.line); return Flow::Normal;
      case Node::Kind::Output: emit(out, eval(*n.expr).str(), n.line); return Flow::Normal;
      case Node::Kind::If:
        for (const auto& [cond, body] : n.branches)
          if (!cond || eval(*cond).truthy()) return exec_body(body, out);
        return Flow::Normal;
      case Node::Kind::For: exec_for(n, out); return Flow::Normal;
      case Node::Kind::Set: exec_set(n); return Flow::Normal;
      case Node::Kind::SetBlock: {  // the body renders in a scope of its own, as jinja2's inner frame
        std::string captured;
        exec_inner(n.body, captured);
        assign(n.text, apply_filters(n.filters, Value(std::move(captured))));
        return Flow::Normal;
      }
      case Node::Kind::FilterBlock: {
        std::string captured;
        const Flow f = exec_inner(n.body, captured);
        emit(out, apply_filters(n.filters, Value(std::move(captured))).str(), n.line);
        return f;
      }
      case Node::Kind::Macro: assign(n.text, make_macro(n)); return Flow::Normal;
      case Node::Kind::CallBlock: {
        // caller() renders the body where the call block is.
        const std::vector<Scope*> here = scopes_;
        const Node* node = &n;
        // The scopes it renders in live as long as this block runs: a caller kept past it fails.
        auto alive = std::make_shared<bool>(true);
        struct Expire {
          std::shared_ptr<bool> a;
          ~Expire() { *a = false; }
        } expire{alive};
        Value caller = Value::callable(
            [this, here, node, alive](const Args& args) {
              if (!*alive) fail(node->line, "caller() called after its call block ended");
              return invoke(*node, args, here);
            },
            "caller");
        const Expr& call = *n.expr;
        Value callee = eval(*call.a);
        Args args = eval_args(call);
        args.keyword.emplace_back("caller", std::move(caller));
        emit(out, call_value(callee, args, call.line).str(), n.line);
        return Flow::Normal;
      }
      case Node::Kind::Break: return Flow::Break;
      case Node::Kind::Continue: return Flow::Continue;
    }
    return Flow::Normal;
  }

  List iterate(const Value& v, int line) const override {
    switch (v.kind()) {
      case Value::Kind::Undefined: return {};
      case Value::Kind::Array: return v.as_list();
      case Value::Kind::Map: {
        List keys;
        for (size_t i = 0; i < v.as_dict().size(); ++i) keys.push_back(v.key_at(i));
        return keys;
      }
      case Value::Kind::String: {
        List out;
        for (auto& c : code_points(v.as_string())) out.emplace_back(c);
        return out;
      }
      default: fail(line, std::string("'") + v.type_name() + "' object is not iterable");
    }
  }

  void bind_targets(Scope& scope, const std::vector<std::string>& targets, const Value& item, int line) {
    if (targets.size() == 1) {
      scope[targets[0]] = item;
      return;
    }
    const List parts = iterate(item, line);
    if (parts.size() != targets.size())
      fail(line, "cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(targets.size()));
    for (size_t i = 0; i < targets.size(); ++i) scope[targets[i]] = parts[i];
  }

  void exec_for(const Node& n, std::string& out) {
    const List all = iterate(eval(*n.expr), n.line);
    List items;
    if (n.cond) {
      for (const auto& it : all) {
        Scope probe;
        bind_targets(probe, n.targets, it, n.line);
        scopes_.push_back(&probe);
        const bool keep = eval(*n.cond).truthy();
        scopes_.pop_back();
        if (keep) items.push_back(it);
      }
    } else {
      items = all;
    }
    if (items.empty()) {
      Scope s;
      scopes_.push_back(&s);
      exec_body(n.else_body, out);
      scopes_.pop_back();
      return;
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      Scope s;
      bind_targets(s, n.targets, items[static_cast<size_t>(i)], n.line);
      Dict loop = {{"index", Value(i + 1)},
                   {"index0", Value(i)},
                   {"revindex", Value(len - i)},
                   {"revindex0", Value(len - i - 1)},
                   {"first", Value(i == 0)},
                   {"last", Value(i == len - 1)},
                   {"length", Value(len)},
                   {"depth", Value(int64_t{1})},
                   {"depth0", Value(int64_t{0})},
                   {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item")},
                   {"nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item")},
                   {"cycle", Value::callable(
                                 [i](const Args& a) {
                                   KVPR_CHECK(!a.positional.empty(), "no items for cycling given");
                                   return a.positional[static_cast<size_t>(i) % a.positional.size()];
                                 },
                                 "cycle")}};
      s["loop"] = Value(std::move(loop));
      scopes_.push_back(&s);
      Flow f;
      try {
        f = exec_body(n.body, out);
      } catch (...) {
        scopes_.pop_back();
        throw;
      }
      scopes_.pop_back();
      if (f == Flow::Break) break;
    }
  }

  void exec_set(const Node& n) {
    Value v = eval(*n.expr);
    if (!n.attr.empty()) {
      Value ns = lookup(n.text);
      if (ns.kind() != Value::Kind::Namespace) fail(n.line, "cannot assign attribute on non-namespace object");
      Dict& d = ns.namespace_dict();
      for (auto& [k, e] : d)
        if (k == n.attr) {
          e = std::move(v);
          return;
        }
      d.emplace_back(n.attr, std::move(v));
      return;
    }
    if (n.targets.size() == 1) {
      assign(n.targets[0], std::move(v));
      return;
    }
    Scope tmp;
    bind_targets(tmp, n.targets, v, n.line);
    for (auto& [k, e] : tmp) assign(k, std::move(e));
  }

  Value make_macro(const Node& n) {
    const Node* node = &n;
    return Value::callable([this, node](const Args& args) { return invoke(*node, args, {&globals_, &top_}); }, n.text);
  }

  // Renders `body` in a scope of its own: what it sets stays there.
  Flow exec_inner(const std::vector<NodePtr>& body, std::string& out) {
    Scope inner;
    scopes_.push_back(&inner);
    struct Pop {
      std::vector<Scope*>& scopes;
      ~Pop() { scopes.pop_back(); }
    } pop{scopes_};
    return exec_body(body, out);
  }

  // Renders a macro's or a call block's body as a call: one call deeper, in `frame` (a macro: the
  // template's globals and top level; caller(): where its call block is) and a frame of its own
  // with the parameters bound from `args` (defaults evaluated there) and a given caller.
  Value invoke(const Node& node, const Args& args, std::vector<Scope*> frame) {
    if (call_depth_ + 1 > limits_.max_call_depth)
      fail(node.line, "macros nested deeper than " + std::to_string(limits_.max_call_depth));
    if (args.positional.size() > node.params.size())
      fail(node.line, "'" + node.text + "' takes not more than " + std::to_string(node.params.size()) + " argument(s)");
    struct Restore {
      Renderer& r;
      std::vector<Scope*> saved;
      ~Restore() {
        r.scopes_ = std::move(saved);
        --r.call_depth_;
      }
    } restore{*this, scopes_};
    ++call_depth_;
    Scope local;
    frame.push_back(&local);
    scopes_ = std::move(frame);
    for (size_t i = 0; i < node.params.size(); ++i) {
      const auto& [name, def] = node.params[i];
      const Value* a = args.get(i, name);
      local[name] = a ? *a : def ? eval(*def) : Value::undefined("'" + name + "' is undefined");
    }
    for (const auto& [k, v] : args.keyword)
      if (k == "caller") local["caller"] = v;
    std::string text;
    exec_body(node.body, text);
    return Value(std::move(text));
  }

  // ------------------------------------------------------------------ expressions

  Args eval_args(const Expr& e) {
    Args a;
    for (const auto& x : e.items) a.positional.push_back(eval(*x));
    for (const auto& [k, x] : e.kwargs) a.keyword.emplace_back(k, eval(*x));
    return a;
  }

  Value call_value(const Value& callee, const Args& args, int line) {
    if (callee.is_undefined()) fail(line, callee.hint().empty() ? "calling an undefined value" : callee.hint());
    if (!callee.is_callable()) fail(line, std::string("'") + callee.type_name() + "' object is not callable");
    try {
      return callee.call(args);
    } catch (const Error& e) {
      const std::string m = e.what();
      if (m.rfind("line ", 0) == 0 || callee.callable_name() == "raise_exception") throw;
      fail(line, m);
    }
  }

  Value eval(const Expr& e) {
    step(e.line);
    switch (e.kind) {
      case Expr::Kind::Literal: return e.value;
      case Expr::Kind::Name: return lookup(e.name);
      case Expr::Kind::ListLiteral: {
        List l;
        for (const auto& x : e.items) l.push_back(eval(*x));
        return nested(e.negated ? Value::tuple(std::move(l)) : Value(std::move(l)), e.line);
      }
      case Expr::Kind::DictLiteral: return dict_literal(e);
      case Expr::Kind::Attr: return get_attr(eval(*e.a), e.name, e.line);
      case Expr::Kind::Item: return get_item(eval(*e.a), eval(*e.b), e.line);
      case Expr::Kind::Slice: {
        const Value v = eval(*e.a);
        Value parts[3];
        for (size_t i = 0; i < e.items.size() && i < 3; ++i)
          if (e.items[i]) parts[i] = eval(*e.items[i]);
        return slice(v, parts[0], parts[1], parts[2], e.line);
      }
      case Expr::Kind::Call: {
        const Value callee = eval(*e.a);
        return call_value(callee, eval_args(e), e.line);
      }
      case Expr::Kind::Filter: return apply_filter(e, eval(*e.a));
      case Expr::Kind::Test: {
        const bool r = jinja::apply_test(*this, e.name, eval(*e.a), eval_args(e), e.line);
        return Value(e.negated ? !r : r);
      }
      case Expr::Kind::Not: return Value(!eval(*e.a).truthy());
      case Expr::Kind::Neg:
      case Expr::Kind::Pos: return unary(e);
      case Expr::Kind::And: {
        Value a = eval(*e.a);
        return a.truthy() ? eval(*e.b) : a;
      }
      case Expr::Kind::Or: {
        Value a = eval(*e.a);
        return a.truthy() ? a : eval(*e.b);
      }
      case Expr::Kind::Binary: return binary(e.name, eval(*e.a), eval(*e.b), e.line);
      case Expr::Kind::Compare: {
        Value left = eval(*e.a);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.items[i]);
          if (!compare(e.ops[i], left, right, e.line)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::Cond:
        if (eval(*e.b).truthy()) return eval(*e.a);
        return e.c ? eval(*e.c) : Value::undefined("the conditional expression's false branch");
    }
    return Value();
  }

  // {k: v, ...}: a later key replaces an earlier one's value, in the first one's place.
  Value dict_literal(const Expr& e) {
    Dict d;
    List keys;
    bool plain = true;
    for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
      Value k = eval(*e.items[i]);
      Value v = eval(*e.items[i + 1]);
      const std::string key = Value::key_text(k);
      plain = plain && k.is_string();
      auto it = std::find_if(d.begin(), d.end(), [&](const auto& p) { return p.first == key; });
      if (it != d.end()) {
        it->second = std::move(v);
      } else {
        d.emplace_back(key, std::move(v));
        keys.push_back(std::move(k));
      }
    }
    return nested(plain ? Value(std::move(d)) : Value::dict_with_keys(std::move(d), std::move(keys)), e.line);
  }

  // -a and +a on numbers.
  Value unary(const Expr& e) {
    const Value v = eval(*e.a);
    if (!v.is_number()) fail(e.line, std::string("bad operand type for unary -: '") + v.type_name() + "'");
    if (e.kind == Expr::Kind::Pos) return v;
    if (v.kind() == Value::Kind::Float) return Value(-v.as_double());
    int64_t r = 0;
    if (__builtin_sub_overflow(int64_t{0}, v.as_int(), &r)) fail(e.line, "integer overflow in unary -");
    return Value(r);
  }

  // A list or dict nested past kMaxNesting is refused where it is made (printing, comparing and
  // JSON recurse over it).
  static Value nested(Value v, int line) {
    if (v.nesting() > kMaxNesting) fail(line, "lists and dicts nested deeper than " + std::to_string(kMaxNesting));
    return v;
  }

  static bool contains(const Value& container, const Value& item, int line) {
    switch (container.kind()) {
      case Value::Kind::String:
        if (!item.is_string()) fail(line, std::string("'in <string>' requires string as left operand, not ") + item.type_name());
        return container.as_string().find(item.as_string()) != std::string::npos;
      case Value::Kind::Array:
        for (const auto& x : container.as_list())
          if (x == item) return true;
        return false;
      case Value::Kind::Map:
      case Value::Kind::Namespace: return container.find(Value::key_text(item)) != nullptr;
      case Value::Kind::Undefined: return false;
      default: fail(line, std::string("argument of type '") + container.type_name() + "' is not iterable");
    }
  }

  bool compare(const std::string& op, const Value& a, const Value& b, int line) override {
    if (op == "==") return a == b;
    if (op == "!=") return !(a == b);
    if (op == "in") return contains(b, a, line);
    if (op == "notin") return !contains(b, a, line);
    try {
      if (op == "<") return less_than(a, b);
      if (op == ">") return less_than(b, a);
      if (op == "<=") return !less_than(b, a);
      if (op == ">=") return !less_than(a, b);
    } catch (const Error& err) {
      fail(line, err.what());
    }
    fail(line, "unknown comparison " + op);
  }

  Value binary(const std::string& op, const Value& a, const Value& b, int line) override {
    auto sized = [&](std::string s) {
      if (s.size() > limits_.max_output) fail(line, "a string past the output budget of " + std::to_string(limits_.max_output) + " bytes");
      return Value(std::move(s));
    };
    if (op == "~") return sized(a.str() + b.str());
    auto type_error = [&]() -> Value {
      if (a.is_undefined()) fail(line, a.hint());
      if (b.is_undefined()) fail(line, b.hint());
      fail(line, "unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
    };
    const bool nums = a.is_number() && b.is_number();
    const bool floats = nums && (a.kind() == Value::Kind::Float || b.kind() == Value::Kind::Float);
    // Integers past 64 bits (Python's would grow): an error, not a wrapped value.
    int64_t r = 0;
    auto checked = [&](bool overflow) {  // after the builtin has written r
      if (overflow) fail(line, "integer overflow in " + op);
      return Value(r);
    };
    if (op == "+") {
      if (nums) return floats ? Value(a.as_double() + b.as_double()) : checked(__builtin_add_overflow(a.as_int(), b.as_int(), &r));
      if (a.is_string() && b.is_string()) return sized(a.as_string() + b.as_string());
      if (a.is_list() && b.is_list()) {  // list + list, tuple + tuple (Python has no list + tuple)
        if (a.is_tuple() != b.is_tuple())
          fail(line, std::string("can only concatenate ") + (a.is_tuple() ? "tuple" : "list") + " (not \"" +
                         (b.is_tuple() ? "tuple" : "list") + "\") to " + (a.is_tuple() ? "tuple" : "list"));
        if (a.as_list().size() + b.as_list().size() > kMaxItems) fail(line, "a list past " + std::to_string(kMaxItems) + " items");
        List l = a.as_list();
        l.insert(l.end(), b.as_list().begin(), b.as_list().end());
        return nested(a.is_tuple() ? Value::tuple(std::move(l)) : Value(std::move(l)), line);
      }
      return type_error();
    }
    if (op == "-") {
      if (nums) return floats ? Value(a.as_double() - b.as_double()) : checked(__builtin_sub_overflow(a.as_int(), b.as_int(), &r));
      return type_error();
    }
    if (op == "*") {
      if (nums) return floats ? Value(a.as_double() * b.as_double()) : checked(__builtin_mul_overflow(a.as_int(), b.as_int(), &r));
      const Value* seq = a.is_string() || a.is_list() ? &a : b.is_string() || b.is_list() ? &b : nullptr;
      const Value* times = seq == &a ? &b : &a;
      if (!seq || !times->is_number() || times->kind() == Value::Kind::Float) return type_error();
      return repeat(*seq, std::max<int64_t>(0, times->as_int()), line);
    }
    if (op == "%" && a.is_string()) {
      try {
        return Value(percent_format(a.as_string(), b));
      } catch (const Error& err) {
        fail(line, err.what());
      }
    }
    if (!nums) return type_error();
    if (op == "/") {
      if (b.as_double() == 0) fail(line, "division by zero");
      return Value(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
      if (b.as_double() == 0) fail(line, op == "%" ? "modulo by zero" : "integer division or modulo by zero");
      if (floats) {
        const double q = std::floor(a.as_double() / b.as_double());
        return op == "//" ? Value(q) : Value(a.as_double() - q * b.as_double());
      }
      if (b.as_int() == -1) return op == "//" ? checked(__builtin_sub_overflow(int64_t{0}, a.as_int(), &r)) : Value(int64_t{0});
      return op == "//" ? Value(floor_div(a.as_int(), b.as_int())) : Value(floor_mod(a.as_int(), b.as_int()));
    }
    if (op == "**") {
      if (floats || b.as_int() < 0) return Value(std::pow(a.as_double(), b.as_double()));
      return power(a.as_int(), b.as_int(), line);
    }
    fail(line, "unknown operator " + op);
  }

  // A string or list `n` times over, within the output budget (strings) or kMaxItems (lists).
  Value repeat(const Value& seq, int64_t n, int line) const {
    const size_t unit = seq.is_string() ? seq.as_string().size() : seq.as_list().size();
    const size_t cap = seq.is_string() ? limits_.max_output : kMaxItems;
    if (unit > 0 && static_cast<uint64_t>(n) > cap / unit) fail(line, "a repetition past the output budget");
    if (seq.is_string()) {
      std::string s;
      for (int64_t i = 0; i < n; ++i) s += seq.as_string();
      return Value(std::move(s));
    }
    List l;
    for (int64_t i = 0; i < n; ++i) l.insert(l.end(), seq.as_list().begin(), seq.as_list().end());
    return Value(std::move(l));
  }

  // base ** exp for exp >= 0 in 64-bit integers (an overflow is an error, as Python's would grow).
  static Value power(int64_t base, int64_t exp, int line) {
    int64_t p = 1;
    for (int64_t i = 0; i < exp; ++i) {
      if (__builtin_mul_overflow(p, base, &p)) fail(line, "integer overflow in **");
      if (p == 0 || p == 1) break;  // 0 and 1 stay; -1 alternates below
      if (p == -1) return Value((exp - i - 1) % 2 == 0 ? int64_t{-1} : int64_t{1});
    }
    return Value(p);
  }

  Value slice(const Value& v, const Value& start, const Value& stop, const Value& step_v, int line) {
    if (v.is_list()) {
      List out;
      for (int64_t i : slice_indices(static_cast<int64_t>(v.as_list().size()), start, stop, step_v))
        out.push_back(v.as_list()[static_cast<size_t>(i)]);
      return v.is_tuple() ? Value::tuple(std::move(out)) : Value(std::move(out));
    }
    if (v.is_string()) {
      const std::vector<std::string> cps = code_points(v.as_string());
      std::string out;
      for (int64_t i : slice_indices(static_cast<int64_t>(cps.size()), start, stop, step_v)) out += cps[static_cast<size_t>(i)];
      return Value(std::move(out));
    }
    if (v.is_undefined()) fail(line, v.hint());
    fail(line, std::string("'") + v.type_name() + "' object is not subscriptable");
  }

  Value get_item(const Value& v, const Value& key, int line) override {
    switch (v.kind()) {
      case Value::Kind::Undefined: fail(line, v.hint());
      case Value::Kind::Map:
      case Value::Kind::Namespace: {
        if (const Value* f = v.find(Value::key_text(key))) return *f;
        if (key.is_string()) return get_attr(v, key.as_string(), line);
        return Value::undefined("'dict object' has no attribute " + key.repr());
      }
      case Value::Kind::Array:
      case Value::Kind::String: {
        if (!key.is_number() || key.kind() == Value::Kind::Float) {
          if (key.is_string()) return get_attr(v, key.as_string(), line);
          fail(line, std::string(v.type_name()) + " indices must be integers, not " + key.type_name());
        }
        int64_t i = key.as_int();
        if (v.is_list()) {
          const int64_t n = static_cast<int64_t>(v.as_list().size());
          if (i < 0) i += n;
          if (i < 0 || i >= n) return Value::undefined(std::string(v.type_name()) + " object has no element " + key.str());
          return v.as_list()[static_cast<size_t>(i)];
        }
        const std::vector<std::string> cps = code_points(v.as_string());
        const int64_t n = static_cast<int64_t>(cps.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined("str object has no element " + key.str());
        return Value(cps[static_cast<size_t>(i)]);
      }
      default: return Value::undefined(std::string("'") + v.type_name() + "' object has no element " + key.repr());
    }
  }

  Value get_attr(const Value& v, const std::string& name, int line) override {
    switch (v.kind()) {
      case Value::Kind::Undefined: fail(line, v.hint());
      case Value::Kind::Namespace:
        if (const Value* f = v.find(name)) return *f;
        return Value::undefined("'Namespace' object has no attribute '" + name + "'");
      case Value::Kind::Map: {
        if (Value m = dict_method(v, name); m.is_callable()) return m;
        if (const Value* f = v.find(name)) return *f;
        return Value::undefined("'dict object' has no attribute '" + name + "'");
      }
      case Value::Kind::String: {
        if (Value m = string_method(v.as_string(), name); m.is_callable()) return m;
        return Value::undefined("'str object' has no attribute '" + name + "'");
      }
      case Value::Kind::Array: {
        if (name == "index" || name == "count") {
          const List l = v.as_list();
          const bool index = name == "index";
          return Value::callable(
              [l, index](const Args& a) {
                KVPR_CHECK(!a.positional.empty(), "list.", index ? "index" : "count", " takes an argument");
                int64_t n = 0;
                for (size_t i = 0; i < l.size(); ++i)
                  if (l[i] == a.positional[0]) {
                    if (index) return Value(static_cast<int64_t>(i));
                    ++n;
                  }
                KVPR_CHECK(!index, a.positional[0].repr(), " is not in list");
                return Value(n);
              },
              name);
        }
        return Value::undefined("'list object' has no attribute '" + name + "'");
      }
      default: return Value::undefined(std::string("'") + v.type_name() + "' object has no attribute '" + name + "'");
    }
  }

  // ------------------------------------------------------------------ filters and tests

  Value apply_filters(const std::vector<ExprPtr>& filters, Value v) {
    for (const auto& f : filters) v = apply_filter(*f, std::move(v));
    return v;
  }

  Value apply_filter(const Expr& f, const Value& v) {
    const Args a = eval_args(f);
    try {
      return jinja::apply_filter(*this, f.name, v, a, f.line);
    } catch (const Error& e) {
      const std::string m = e.what();
      if (m.rfind("line ", 0) == 0) throw;
      fail(f.line, "filter " + f.name + ": " + m);
    }
  }

  const Limits& limits_;
  Scope globals_, top_;
  std::vector<Scope*> scopes_;
  std::vector<Value> namespaces_;  // every namespace() this render made
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace

std::string Template::render(const Value& context) const {
  Renderer r(limits_, context);
  try {
    return r.run(*root_);
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    KVPR_THROW("the template ran out of memory");
  } catch (const std::exception& e) {
    KVPR_THROW("the template failed: ", e.what());
  }
}

}  // namespace kvpr::jinja

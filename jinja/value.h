// The values a Jinja chat template computes with, as Python's jinja2 has them (the engine
// transformers renders chat templates with): undefined, none, booleans, integers, floats,
// strings, lists and tuples, dicts in insertion order, namespaces (the one mutable value), and
// callables (macros, the loop's cycle, bound string and dict methods, globals). Printing,
// comparing, truthiness and JSON follow Python's str(), ==, bool() and json.dumps.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/json.h"

namespace kvpr::jinja {

class Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python's dict

// A call's arguments: positional, then keyword ones.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The positional i or keyword `name` argument, else `fallback` (undefined when not given).
  const Value* get(size_t i, const std::string& name) const;
};
using Function = std::function<Value(const Args&)>;

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, Array, Map, Namespace, Callable };

  Value() = default;  // undefined
  static Value none();
  Value(bool b);
  Value(int v) : Value(static_cast<int64_t>(v)) {}
  Value(int64_t v);
  Value(double v);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  Value(List l);
  Value(Dict d);
  // A tuple: a list that prints as (a, b) and equals no list, as Python's.
  static Value tuple(List l);
  // How deeply lists and dicts nest in this value (0 for a scalar): what the interpreter bounds.
  int nesting() const { return nesting_; }
  // A dict some of whose keys are not strings ({4096: 512}): entries are found by the key's
  // repr, and iterating gives `keys` (one per entry) back.
  static Value dict_with_keys(Dict d, List keys);
  static Value namespace_of(Dict d);  // namespace(): attributes set with {% set ns.x = ... %}
  static Value callable(Function f, std::string name);
  // A template's name for the undefined value, so that errors can say what was undefined.
  static Value undefined(std::string hint);
  static Value from_json(const json::Value& v);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_list() const { return kind_ == Kind::Array; }
  bool is_tuple() const { return kind_ == Kind::Array && tuple_; }
  bool is_dict() const { return kind_ == Kind::Map || kind_ == Kind::Namespace; }
  bool is_callable() const { return kind_ == Kind::Callable; }

  bool as_bool() const { return b_; }
  int64_t as_int() const;    // ints and booleans
  double as_double() const;  // any number
  const std::string& as_string() const { return *s_; }
  const List& as_list() const { return *l_; }
  const Dict& as_dict() const { return *d_; }
  Dict& namespace_dict() const { return *d_; }  // a namespace's attributes (shared: it is mutable)
  const std::string& hint() const;  // undefined: what it stands for ("" when nothing says)
  Value call(const Args& args) const { return (*f_)(args); }
  const std::string& callable_name() const { return *s_; }

  // A dict's entry or null.
  const Value* find(const std::string& key) const;
  // A dict's key i as the template wrote it (a string, or what dict_with_keys was given).
  Value key_at(size_t i) const;
  // The text a key is stored under: a string as it is, anything else its repr.
  static std::string key_text(const Value& key);
  bool truthy() const;  // Python's bool()
  std::string str() const;   // Python's str() (undefined: "")
  std::string repr() const;  // Python's repr() (what a list prints its strings as)
  // Python's json.dumps(ensure_ascii=False) with transformers' tojson arguments: indent < 0 for
  // none; separators default as json.dumps's (", " ": ", or "," ": " with an indent).
  std::string to_json(int indent, const std::string& item_sep, const std::string& key_sep, bool sort_keys) const;
  const char* type_name() const;  // Python's type name, for errors

 private:
  Kind kind_ = Kind::Undefined;
  int nesting_ = 0;
  bool b_ = false;
  bool tuple_ = false;
  int64_t i_ = 0;
  double f_num_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<const List> l_;
  std::shared_ptr<Dict> d_;
  std::shared_ptr<const List> keys_;  // dict_with_keys
  std::shared_ptr<const Function> f_;
};

bool operator==(const Value& a, const Value& b);  // Python's ==: 1 == 1.0 == True, deep for lists and dicts
// Python's <, for numbers, strings and lists; throws for others.
bool less_than(const Value& a, const Value& b);

// Python's repr() of a float: the shortest text that reads back the same ("1.0", "1e-05").
std::string python_float(double v);

// UTF-8 text as Python's str sees it: by code point.
std::vector<std::string> code_points(const std::string& s);
bool python_space(char32_t c);  // str.isspace()
// str.strip() / lstrip() / rstrip(): whitespace, or the code points in `chars`.
std::string strip(const std::string& s, bool left, bool right, const std::string* chars = nullptr);

}  // namespace kvpr::jinja

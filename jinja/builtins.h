// What templates call by name: filters (`x | name`), tests (`x is name`), the methods of str and
// dict values, and the globals (range, namespace, dict, raise_exception, strftime_now), as
// jinja2 and transformers provide them. One table per kind (filters.cc; the rest builtins.cc),
// which the parser also checks names against.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "jinja/jinja.h"
#include "jinja/value.h"

namespace kvpr::jinja {

using Scope = std::unordered_map<std::string, Value>;

// What a filter, test or global may ask of the render it runs in (renderer.cc implements it).
class RenderContext {
 public:
  virtual ~RenderContext() = default;
  virtual const Limits& limits() const = 0;
  // Items of a sequence: a list's, a dict's keys, a string's characters (undefined: none).
  virtual List iterate(const Value& v, int line) const = 0;
  virtual Value get_item(const Value& v, const Value& key, int line) = 0;   // v[key]
  virtual Value get_attr(const Value& v, const std::string& name, int line) = 0;  // v.name
  virtual Value binary(const std::string& op, const Value& a, const Value& b, int line) = 0;
  virtual bool compare(const std::string& op, const Value& a, const Value& b, int line) = 0;
  virtual void add_steps(int64_t n) = 0;  // work done inside a builtin, counted against the step budget
  // A namespace() made by the template, kept so that the render can break its cycles at the end.
  virtual Value keep_namespace(Value ns) = 0;
};

// kvpr::Error "line N: what".
[[noreturn]] void fail(int line, const std::string& what);

// The filters and tests the interpreter has (a template naming another is refused at parse).
bool known_filter(const std::string& name);
bool known_test(const std::string& name);

Value apply_filter(RenderContext& ctx, const std::string& name, const Value& v, const Args& a, int line);
bool apply_test(RenderContext& ctx, const std::string& name, const Value& v, const Args& a, int line);
// The method `name` of a str or dict value, bound to it (a callable), or an empty Value when it
// has none.
Value string_method(const std::string& s, const std::string& name);
Value dict_method(const Value& d, const std::string& name);
Scope globals(RenderContext& ctx);

}  // namespace kvpr::jinja

// A small JSON document model for the engine's files (config.json, safetensors headers,
// tokenizer files), its --json output, and the daemon's requests (parse_strict) and responses.
// The engine depends only on the C++ standard library so that it builds anywhere the CUDA
// toolkit does.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace kvpr::json {

class Value;
using Array = std::vector<Value>;
// Objects keep insertion order (output is stable and readable); lookups are linear,
// which is fine for the small objects we query. Large maps (vocab.json) are iterated.
using Object = std::vector<std::pair<std::string, Value>>;

class Value {
 public:
  enum class Kind { Null, Bool, Int, Double, Str, Arr, Obj };

  Value() = default;
  Value(std::nullptr_t) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(int64_t i) : v_(i) {}
  Value(uint64_t i) : v_(static_cast<int64_t>(i)) {}
  Value(double d) : v_(d) {}
  Value(float d) : v_(static_cast<double>(d)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(std::string_view s) : v_(std::string(s)) {}
  Value(Array a) : v_(std::make_shared<Array>(std::move(a))) {}
  Value(Object o) : v_(std::make_shared<Object>(std::move(o))) {}

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_null() const { return kind() == Kind::Null; }
  bool is_bool() const { return kind() == Kind::Bool; }
  bool is_number() const { return kind() == Kind::Int || kind() == Kind::Double; }
  bool is_int() const { return kind() == Kind::Int; }
  bool is_string() const { return kind() == Kind::Str; }
  bool is_array() const { return kind() == Kind::Arr; }
  bool is_object() const { return kind() == Kind::Obj; }

  // Accessors throw kvpr::Error naming the expected type when the kind differs.
  bool as_bool() const;
  int64_t as_int() const;  // also accepts a double with an integral value
  double as_double() const;
  const std::string& as_string() const;
  const Array& as_array() const;
  Array& as_array();
  const Object& as_object() const;
  Object& as_object();

  // Object lookup: nullptr when absent (or when this is not an object).
  const Value* find(std::string_view key) const;
  // Object insert-or-assign.
  void set(std::string key, Value v);
  void push_back(Value v) { as_array().push_back(std::move(v)); }

  std::string dump() const;  // compact JSON, UTF-8
  // As Python's json.dumps(value, ensure_ascii=False) writes it (what Hugging Face's chat
  // templates get from `tojson`): ", " and ": " separators, floats as Python's repr (1.0,
  // 1e-05, 1e+16), NaN/Infinity, non-ASCII as is; a key given twice keeps its first place and
  // its last value, as json.loads leaves a dict. indent >= 0: as json.dumps(value, indent=indent)
  // (one member per line, "," at line ends).
  std::string dump_python(int indent = -1) const;

 private:
  std::variant<std::monostate, bool, int64_t, double, std::string, std::shared_ptr<Array>,
               std::shared_ptr<Object>>
      v_;
};

// Parses a complete JSON text. Errors throw kvpr::Error "<what> at line L column C".
Value parse(std::string_view text);

// Parses a JSON text from a peer (an HTTP request body) as RFC 8259 has it: invalid UTF-8,
// lone surrogate escapes and NaN/Infinity are errors; a key given twice keeps its first place
// and its last value (as json.loads leaves a dict). Nesting past 256 levels is an error, as in
// parse().
Value parse_strict(std::string_view text);

// Parses the JSON value at the very start of `text` (no whitespace before it) and sets *end to
// where it ends; what follows is not read (Python's JSONDecoder.raw_decode).
Value parse_leading(std::string_view text, size_t* end);

// Reads and parses a file; errors name the file.
Value parse_file(const std::string& path);

// Appends s as a JSON string literal (quoted, escaped).
void append_quoted(std::string& out, std::string_view s);
// Appends Python's repr of a float as json.dumps writes it: the shortest digits that round-trip,
// fixed notation for decimal exponents -4..15, else d.ddde+XX; NaN, Infinity, -Infinity.
void append_python_float(std::string& out, double d);

}  // namespace kvpr::json

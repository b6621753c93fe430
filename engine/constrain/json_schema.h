// Decoding constrained to a JSON Schema (OpenAI's response_format {"type": "json_schema"}, and
// tool calls forced by tool_choice): a schema compiled to a graph of nodes, and a byte-level
// recognizer of the JSON texts valid against it, the alternatives of an anyOf followed side by
// side until the text tells them apart.
//
// The subset: type (one or a list), properties (at most SchemaLimits::kMaxProperties; a
// property's schema false or {"not": {}}: the key may not appear), required,
// additionalProperties (false, true or a schema), patternProperties (beside additionalProperties
// false too: the keys are then the listed ones and those a pattern matches), dependencies and
// dependentRequired (lists of keys a key requires; a schema there, and dependentSchemas, written
// out as an anyOf of the object without the key and the object with it meeting the schema),
// minProperties, maxProperties, items (a schema, or false), prefixItems (tuples: Pydantic's
// tuple[int, str]; items then are those after them), minItems, maxItems, uniqueItems (true for
// items that are literals, strings or numbers), enum, const, anyOf (and oneOf, as anyOf: the
// text is valid against one of them; an alternative no value meets left out), minLength,
// maxLength, minimum, maximum, exclusiveMinimum, exclusiveMaximum (compared exactly: the text's
// decimal value against the bound as Python's repr writes it; a bounded number is written
// without an exponent), multipleOf (a decimal of at most 12 digits, beside no upper bound: the
// text's value divided by it is an integer, written without an exponent), pattern (regex.h's
// subset) and format (date-time, date, time, uuid, email, ipv4 as regex.h's format_pattern; other
// formats are annotations, as JSON Schema 2020-12 makes every format by default; a string under a
// pattern or format is written without \u escapes), $ref to "#" or a JSON pointer into the schema
// ("#/$defs/A", "#/definitions/a/definitions/b", %-escapes decoded; recursion included), required
// keys that properties does not list (of additionalProperties' schema), not {} and not over a
// list of required keys (one of them absent), and boolean schemas; annotations (title,
// description, default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly, and
// every keyword JSON Schema does not define, as its validators read them) are ignored. A keyword
// that constrains values and is not enforced here (if, not over other schemas, propertyNames,
// contains...) is refused by name (kvpr::Error) rather than ignored, so that a schema is never
// silently loosened; a schema no value meets is refused too.
// The text is written in one style the schema fixes nothing about: keys of a closed object
// (additionalProperties false) as plain strings without escapes, each at most once; enum and
// const values as Python's compact json.dumps writes them (ensure_ascii=False).
#pragma once

#include <bit>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/base/json.h"
#include "engine/constrain/json_lex.h"
#include "engine/constrain/regex.h"

namespace kvpr {

// A set of an object's keys, by their index in SchemaNode::names.
struct KeySet {
  static constexpr size_t kMax = 256;  // SchemaLimits::kMaxProperties
  uint64_t w[kMax / 64] = {};
  bool test(size_t i) const { return (w[i >> 6] >> (i & 63)) & 1; }
  void set(size_t i) { w[i >> 6] |= uint64_t{1} << (i & 63); }
  KeySet with(size_t i) const {
    KeySet k = *this;
    k.set(i);
    return k;
  }
  bool any() const {
    for (uint64_t x : w)
      if (x) return true;
    return false;
  }
  int count() const {
    int n = 0;
    for (uint64_t x : w) n += std::popcount(x);
    return n;
  }
  KeySet operator|(const KeySet& o) const {
    KeySet k;
    for (size_t i = 0; i < kMax / 64; ++i) k.w[i] = w[i] | o.w[i];
    return k;
  }
  KeySet operator&(const KeySet& o) const {
    KeySet k;
    for (size_t i = 0; i < kMax / 64; ++i) k.w[i] = w[i] & o.w[i];
    return k;
  }
  KeySet operator~() const {
    KeySet k;
    for (size_t i = 0; i < kMax / 64; ++i) k.w[i] = ~w[i];
    return k;
  }
  KeySet& operator|=(const KeySet& o) { return *this = *this | o; }
};

struct SchemaNode {
  enum class Kind : uint8_t { Any, Object, Array, String, Number, Integer, Literals, AnyOf };
  Kind kind = Kind::Any;
  // Object
  std::vector<std::string> names;  // properties, at most SchemaLimits::kMaxProperties
  std::vector<int> props;          // their nodes (-1: the schema false, the key may not appear)
  KeySet required;                 // names[i] is required
  int additional = -1;             // node of other keys' values; -1: no other keys
  // patternProperties: a key not in names whose text a pattern matches takes that pattern's node
  // (several with different nodes: the key is refused); names matching one had its schema merged
  // into theirs at compile time. Beside additionalProperties false (additional < 0) the keys are
  // those of names and those a pattern matches, each at most once.
  std::vector<std::pair<std::shared_ptr<const Regex>, int>> pattern_props;
  // minProperties, maxProperties (-1: none): keys given, counted once each.
  int64_t min_props = 0, max_props = -1;
  // Whether the keys given that names does not list are remembered (Frame::extra): to count them
  // once (min/maxProperties) or to give each at most once (a closed object's pattern keys).
  bool tracks_extra() const { return min_props > 0 || max_props >= 0 || (additional < 0 && !pattern_props.empty()); }
  // dependencies / dependentRequired: once a key of `first`'s bit is given, those of `second` are
  // required too.
  std::vector<std::pair<KeySet, KeySet>> depends;
  // The keys an object with `given` will have: those, the required ones, and what they require.
  KeySet keys_due(const KeySet& given) const {
    KeySet due = required | given;
    for (bool grew = true; grew;) {
      grew = false;
      for (const auto& [key, needs] : depends)
        if ((due & key).any() && (needs & ~due).any()) {
          due |= needs;
          grew = true;
        }
    }
    return due;
  }
  // Array
  int items = -1;  // node of the items (-1: any), those after prefix
  std::vector<int> prefix;  // prefixItems: the nodes of the first items
  int64_t min_items = 0, max_items = -1;
  // uniqueItems true, for items that are one of a set of literals (enum, const, boolean): each
  // literal at most once.
  bool unique = false;
  // uniqueItems true, for items that are strings, numbers or literals (anyOf them): each value
  // at most once, as JSON Schema compares them ("a" and "\u0061", 1 and 1.0 are one value).
  bool unique_values = false;
  int item(int64_t index, int any) const {  // the node of item `index`
    return index < static_cast<int64_t>(prefix.size()) ? prefix[static_cast<size_t>(index)] : items >= 0 ? items : any;
  }
  // String
  int64_t min_length = 0, max_length = -1;
  // pattern and format (at most one of each), every one of which the string's value must match
  std::vector<std::shared_ptr<const Regex>> regexes;
  // Number, Integer: bounds as decimal texts ("-12.5"); an Integer's are made inclusive integers.
  struct Bound {
    bool set = false, exclusive = false;
    std::string value;
  };
  Bound lo, hi;
  bool bounded() const { return lo.set || hi.set; }
  // multipleOf, as multiple / 10^multiple_scale (0.25: 25 and 2): the value times
  // 10^multiple_scale is an integer that `multiple` divides (0: none).
  int64_t multiple = 0;
  int multiple_scale = 0;
  // Numbers read digit by digit (their text kept): bounded or multipleOf; written without an
  // exponent.
  bool exact() const { return bounded() || multiple > 0; }
  // Literals (enum, const, boolean, null): their texts as compact json.dumps
  std::vector<std::string> literals;
  // AnyOf: the alternatives, flattened once compiled (none is an AnyOf, each once)
  std::vector<int> options;
};

// What one schema may cost. A schema past one of them is refused (kvpr::Error naming the limit),
// so that compiling it, and recognizing text against it, stays bounded whatever a request sends.
struct SchemaLimits {
  static constexpr int kMaxNesting = 64;          // schemas inside schemas, each $ref followed counting one
  static constexpr size_t kMaxNodes = 10000;      // compiled nodes
  static constexpr size_t kMaxProperties = KeySet::kMax;  // an object's listed and required keys
  static constexpr size_t kMaxAlternatives = 100000;  // anyOf options, summed over every anyOf (flattened)
  static constexpr size_t kMaxPatterns = 64;      // distinct pattern and format regexes
  static constexpr size_t kMaxRegexStates = 100000;   // their NFA states together
  // Text alternatives followed side by side (SchemaRecognizer's threads): at most kMaxThreads
  // (the first ones); dropping one narrows what the model may write, never admits a text the
  // schema refuses. 128 keeps every one of 128 forced tool calls (tools' limit) open. The worst
  // case a schema allows (overlapping anyOf options nested in each other, over JSON's 64 levels)
  // is computed at compile time, counted up to kMaxAmbiguity (JsonSchema::ambiguity): past
  // kMaxThreads, what the model writes may be narrowed (a discriminated union nested in itself
  // whose tag comes after the members that nest).
  static constexpr int64_t kMaxThreads = 128;
  static constexpr int64_t kMaxAmbiguity = 1024;
  static constexpr double kMaxCompileSeconds = 2.0;  // a backstop behind the counts above
};

class JsonSchema {
 public:
  // Throws kvpr::Error naming what is not supported or malformed ("$.properties.x: ...") or the
  // SchemaLimits a schema exceeds. A $ref cycle that consumes no text on its way round
  // ({"$ref": "#"}, an anyOf listing itself) is malformed: it names no value.
  static JsonSchema compile(const json::Value& schema);
  const SchemaNode& node(int i) const { return nodes_[static_cast<size_t>(i)]; }
  int root() const { return root_; }
  // The most alternatives a text could have to be followed as at once, counted up to
  // SchemaLimits::kMaxAmbiguity + 1; past kMaxThreads the recognizer keeps the first ones.
  int64_t ambiguity() const { return ambiguity_; }
  int any() const { return any_; }
  // Whether one of its patterns ran into its determinized-state caps (Regex::saturated): what it
  // admits then depends on the texts tried before, so a worker compiles it afresh.
  bool saturated() const;

 private:
  std::vector<SchemaNode> nodes_;
  int root_ = 0, any_ = 0;
  int64_t ambiguity_ = 1;
  friend class SchemaCompiler;
};

class SchemaRecognizer {
 public:
  explicit SchemaRecognizer(const JsonSchema* schema, json_lex::Whitespace whitespace = {}, int max_depth = 64);
  bool feed(uint8_t c);  // false: the byte cannot continue a valid text (the recognizer is then unusable)
  // A token's bytes: true when they continue one of the alternatives followed (each fed alone).
  bool feed(std::string_view bytes);
  // The alternatives followed side by side, and a recognizer of the i-th alone: bytes continue
  // this recognizer exactly when they continue one of its alternatives (feed(bytes)).
  size_t alternatives() const { return threads_.size(); }
  SchemaRecognizer alternative(size_t i) const;
  bool complete() const;
  std::string key() const;  // the state: equal keys accept the same continuations
  // Inside a string under a pattern or format, between characters: the string's text alone, a
  // recognizer without the values around the string (its key() the string's state alone).
  // Bytes without a quote, backslash or control byte continue the string exactly when they
  // continue this, whatever surrounds it; so their mask is the same in every context the string
  // meets (JsonTokenConstraint keeps it once). Null elsewhere.
  std::optional<SchemaRecognizer> string_alone() const;
  // As JsonRecognizer's: one alternative inside a string, or inside an open object's key while
  // any key may come.
  int64_t plain_string_room() const;

 private:
  struct Frame {
    int node = 0;
    bool object = false;
    KeySet seen;        // object: properties given
    int64_t count = 0;  // array: items so far
    uint64_t used = 0;  // unique array: bit i, literal i of its items has been given
    // object whose node tracks_extra(): the keys given that its names does not list; count is
    // then the keys given. Array whose node has unique_values: the items given, as value_of writes
    // them.
    std::vector<std::string> extra;
  };
  enum class Mode : uint8_t { Value, ArrFirst, ObjFirst, ObjKey, Key, Colon, AfterValue, String, Number, Literal, Done };
  struct Thread {
    std::vector<Frame> stack;
    Mode mode = Mode::Value;
    int node = 0;         // Value: the schema of the value due; String/Number/Literal: of the one being read
    uint8_t sub = 0;      // string: escape state; number: where in it
    uint8_t aux = 0;      // string: UTF-8 continuation bytes due
    uint8_t ws = 0;
    int64_t length = 0;   // string: characters so far
    int rx[2] = {0, 0};   // string with regexes: their states (a key: its object's patterns', keys_stepped)
    uint32_t cp = 0;      // string with regexes (or such a key): the code point being read
    std::string key;      // Key: bytes so far; Literal: bytes so far
    int key_node = -1;    // Colon: the node of the value after it
  };
  bool step(Thread& t, uint8_t c, std::vector<Thread>& spawned) const;  // by t.mode:
  bool string_step(Thread& t, uint8_t c) const;
  bool key_step(Thread& t, uint8_t c) const;
  bool structure_step(Thread& t, uint8_t c, std::vector<Thread>& spawned) const;
  bool start_value(Thread& t, uint8_t c, std::vector<Thread>& spawned) const;
  bool end_value(Thread& t) const;
  bool scalar_may_end(const Thread& t) const;
  // Bounded numbers (t.key holds the text so far): some continuation lies within the bounds;
  // the text's value does.
  bool number_viable(const Thread& t) const;
  bool number_in_bounds(const Thread& t) const;
  // multipleOf (t.key the text so far): some continuation is a multiple (within a lower bound);
  // the text's value is one.
  bool multiple_viable(const Thread& t) const;
  bool number_is_multiple(const Thread& t) const;
  bool string_regex_byte(Thread& t, const SchemaNode& n, uint8_t c, uint8_t sub0, uint8_t aux0, int r) const;
  bool close(Thread& t, bool object) const;
  bool object_may_close(const Thread& t) const;
  bool object_may_continue(const Thread& t) const;
  // Whether the object's keys would stay within maxProperties once `seen` are given (count of
  // them before this key, `added` more): the keys they require counted in.
  bool keys_fit(const SchemaNode& n, const Frame& f, const KeySet& seen, int64_t added) const;
  // A closed object's pattern keys: whether some key not given yet that a pattern matches begins
  // with `prefix` (and fits maxProperties).
  // `states`: the patterns' states after the prefix's whole characters, where the key read them
  // (keys_stepped), else null (stepped here).
  bool pattern_key_alive(const SchemaNode& n, const Frame& f, std::string_view prefix, const int* states = nullptr) const;
  // A closed object of one or two patterns: its key's thread steps them as it reads the key (in
  // Thread::rx, Thread::cp), so that each byte costs one step, not the key so far.
  static bool keys_stepped(const SchemaNode& n) {
    return n.kind != SchemaNode::Kind::Any && n.additional < 0 && !n.pattern_props.empty() && n.pattern_props.size() <= 2;
  }
  // In a uniqueItems array: the item literals given so far (null when the value is no such item).
  const uint64_t* used_literals(const Thread& t) const;
  // Whether the value being read is an item of a unique_values array (its text then kept in
  // t.key), and the value of such an item's text, as items are compared.
  bool unique_value_item(const Thread& t) const;
  static std::string value_of(Mode mode, const std::string& text);
  // In a unique_values array: whether the literal's value was given already (it may not begin).
  bool literal_given(const Thread& t, const std::string& literal) const;
  static std::string thread_key(const Thread& t);
  static void merge(std::vector<Thread>& threads);
  SchemaRecognizer(const SchemaRecognizer& other, const Thread& only)
      : schema_(other.schema_), ws_(other.ws_), max_depth_(other.max_depth_), threads_{only} {}

  const JsonSchema* schema_;
  json_lex::Whitespace ws_;
  uint8_t max_depth_;
  std::vector<Thread> threads_;
};

}  // namespace kvpr

// Decoding constrained to JSON (engine/constrain/json_object.h): the recognizer reads exactly the byte
// strings Python's json module reads as one object, every prefix of a valid one stays open, and
// the token masks over a vocabulary are the tokens whose bytes continue the text.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <thread>

#include "engine/base/error.h"
#include "engine/base/json.h"
#include "engine/constrain/token_constraint.h"
#include "engine/constrain/json_schema.h"
#include "engine/constrain/regex.h"
#include "engine/text/tokenizer.h"
#include "tests/test_util.h"

using namespace kvpr;

namespace {
std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

bool reads_object(const std::string& bytes, JsonRecognizer::Options o = {}) {
  JsonRecognizer r(o);
  return r.feed(bytes) && r.complete();
}

// Any whitespace up to 48 bytes in a row: how Python's json writes and reads texts.
JsonRecognizer::Options permissive() {
  JsonRecognizer::Options o;
  o.permissive_whitespace = true;
  return o;
}
}  // namespace

// 965 strings classified by Python's json.loads (tests/scripts/make_json_object_fixtures.py):
// random objects written compact, spaced, indented, ASCII-escaped or not, with bytes deleted,
// inserted and replaced, and hand-made edge cases (UTF-8 overlong forms, surrogates, escapes,
// numbers, literals, trailing data).
TEST(JsonObject, ReadsWhatPythonsJsonReads) {
  const json::Value cases = json::parse_file(test::data_path("json-object") + "/cases.json");
  size_t valid = 0, n = 0;
  for (const auto& c : cases.as_array()) {
    const std::string bytes = unhex(c.find("hex")->as_string());
    const bool want = c.find("object")->as_bool();
    EXPECT_EQ(reads_object(bytes, permissive()), want) << c.find("hex")->as_string();
    if (want) {
      ++valid;
      JsonRecognizer r(permissive());  // every proper prefix of a document is open, and only the whole is complete
      for (size_t i = 0; i < bytes.size(); ++i) {
        ASSERT_TRUE(r.feed(static_cast<uint8_t>(bytes[i]))) << c.find("hex")->as_string() << " at " << i;
        const bool rest_is_ws = bytes.find_first_not_of(" \t\r\n", i + 1) == std::string::npos;
        EXPECT_EQ(r.complete(), rest_is_ws) << c.find("hex")->as_string() << " at " << i;
      }
    }
    ++n;
  }
  EXPECT_GE(n, 900u);
  EXPECT_GE(valid, 400u);
}

TEST(JsonObject, LimitsWhitespaceAndDepthAndTakesOtherValuesWhenAsked) {
  EXPECT_TRUE(reads_object("{" + std::string(48, ' ') + "}", permissive()));
  EXPECT_FALSE(reads_object("{" + std::string(49, ' ') + "}", permissive()));
  EXPECT_TRUE(reads_object("{\"a\": \"" + std::string(200, ' ') + "\"}"));  // inside strings, any
  std::string deep = "{\"a\":" + std::string(63, '[') + std::string(63, ']') + "}";  // 64 levels
  EXPECT_TRUE(reads_object(deep));
  deep = "{\"a\":" + std::string(64, '[') + std::string(64, ']') + "}";
  EXPECT_FALSE(reads_object(deep));
  JsonRecognizer::Options any;
  any.object_only = false;
  for (const char* v : {"[1, 2]", "\"s\"", "true", "null", "-12.5e3", "0"}) EXPECT_TRUE(reads_object(v, any)) << v;
  for (const char* v : {"[1, 2]", "\"s\"", "true", "-12.5e3"}) EXPECT_FALSE(reads_object(v)) << v;
  JsonRecognizer r(any);
  EXPECT_TRUE(r.feed("12"));
  EXPECT_TRUE(r.complete());  // a number at the top level is whole once well formed
  EXPECT_TRUE(r.feed("."));
  EXPECT_FALSE(r.complete());
}

// By default whitespace between tokens is compact, as llama.cpp's JSON-schema grammars write it:
// nothing, one space, or one newline followed by up to 20 spaces or tabs; never a run of blank
// lines or spaces a small model could spend its tokens on.
TEST(JsonObject, CompactWhitespaceIsNothingASpaceOrANewlineAndIndentation) {
  const JsonSchema schema = JsonSchema::compile(json::parse(R"({"type": "object", "properties": {"a": {}}})"));
  auto both = [&](const std::string& text) {
    SchemaRecognizer s(&schema);
    const bool by_schema = s.feed(text) && s.complete();
    EXPECT_EQ(reads_object(text), by_schema) << text;
    return by_schema;
  };
  for (const char* ok : {"{\"a\":1}", "{\"a\": 1}", "{ \"a\" : [1, 2] }", "{\n  \"a\": [\n    1\n  ]\n}",
                         "{\n\t\"a\": 1}", "{\"a\": 1}\n", "{\"a\": 1} "})
    EXPECT_TRUE(both(ok)) << ok;
  const std::string indent20 = "{\n" + std::string(20, ' ') + "\"a\": 1}";
  EXPECT_TRUE(both(indent20));
  for (const std::string& bad : {std::string("{  \"a\": 1}"), std::string("{\n\n\"a\": 1}"), std::string("{\r\n\"a\": 1}"),
                                 std::string("{\t\"a\": 1}"), std::string("{ \n\"a\": 1}"), std::string("{\"a\": 1}\n\n"),
                                 "{\n" + std::string(21, ' ') + "\"a\": 1}"})
    EXPECT_FALSE(both(bad)) << bad;
  // The issue this answers: a constrained answer spending its max_tokens on \r and \n.
  JsonRecognizer r;
  EXPECT_TRUE(r.feed("{\"a\":"));
  EXPECT_FALSE(r.feed("\r"));
  EXPECT_TRUE(reads_object("{  \"a\": 1}", permissive()));  // the permissive form, as before
}

// A vocabulary of JSON pieces, words and special tokens: each mask is exactly the set of ids
// whose bytes the recognizer takes next, end ids come only once the object is complete, and
// decoding by the largest masked logit from random rows always ends in an object that parses.
TEST(JsonObject, TokenMasksAreTheContinuations) {
  auto vocab = std::make_shared<JsonTokenConstraint::Vocabulary>(JsonTokenConstraint::Vocabulary{
      "{", "}", "[", "]", "\"", ":", ",", " ", "\n", "  ", "{\"", "\":", "\",", "\"}", "}}", "]}", "true", "false",
      "null", "nul", "l", "0", "1", "12", ".", "5", "e", "-", "+", "a", "key", "\\", "n", "u", "00e9", "\xc3", "\xa9",
      "\xe6\x9d\xb1", "x\"", "\t", "", ""});  // the last two: special tokens (no text)
  const int32_t V = static_cast<int32_t>(vocab->size());
  const std::vector<int32_t> ends = {V - 1};  // EOS
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  int completed = 0;
  for (int trial = 0; trial < 200; ++trial) {
    JsonTokenConstraint c(vocab);
    JsonRecognizer mirror;
    std::string text;
    for (int step = 0; step < 60; ++step) {
      std::vector<float> logits(static_cast<size_t>(V));
      for (float& l : logits) l = normal(rng);
      std::vector<float> masked = logits;
      const int64_t left = c.mask(masked.data(), V, ends);
      int64_t count = 0;
      for (int32_t id = 0; id < V; ++id) {
        const std::string& b = (*vocab)[static_cast<size_t>(id)];
        JsonRecognizer r = mirror;
        const bool want = id == V - 1 ? mirror.complete() : !b.empty() && r.feed(b);
        ASSERT_EQ(!std::isinf(masked[static_cast<size_t>(id)]), want) << "id " << id << " after " << text;
        if (want) {
          EXPECT_EQ(masked[static_cast<size_t>(id)], logits[static_cast<size_t>(id)]);
        }
        count += want;
      }
      ASSERT_EQ(left, count);
      ASSERT_GT(left, 0) << text;
      const int32_t pick = static_cast<int32_t>(std::max_element(masked.begin(), masked.end()) - masked.begin());
      if (pick == V - 1) {
        ++completed;
        EXPECT_TRUE(json::parse(text).is_object()) << text;
        break;
      }
      c.advance(pick);
      ASSERT_TRUE(mirror.feed((*vocab)[static_cast<size_t>(pick)]));
      text += (*vocab)[static_cast<size_t>(pick)];
    }
  }
  EXPECT_GE(completed, 20);  // random rows do finish objects now and then
  JsonTokenConstraint c(vocab);
  EXPECT_THROW(c.advance(1), Error);  // "}" cannot open the object
}

// Sequences under one mask table (the generator's, one per constraint) share its masks: on four
// threads at once, each sequence's masks equal those of a constraint with a table of its own
// advanced alike, states met by several are computed once (or a few times when rows race), and
// a table past its budget drops masks and computes them again, still the same.
TEST(JsonObject, SequencesUnderOneTableShareItsMasks) {
  auto vocab = std::make_shared<JsonTokenConstraint::Vocabulary>(JsonTokenConstraint::Vocabulary{
      "{", "}", "[", "]", "\"", ":", ",", " ", "{\"", "\":", "\",", "\"}", "true", "false", "null", "0", "1", "12",
      ".", "-", "a", "key", "name", "\\", "n", "\xc3", "\xa9", "x\"", "", ""});
  const int32_t V = static_cast<int32_t>(vocab->size());
  const std::vector<int32_t> ends = {V - 1};
  auto schema = std::make_shared<const JsonSchema>(JsonSchema::compile(json::parse(
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "key": {"type": "array",
          "items": {"type": "integer"}}}, "required": ["name"], "additionalProperties": false})")));
  for (size_t budget : {JsonMaskTable::kDefaultBudgetBytes, size_t{1}}) {
    for (bool with_schema : {false, true}) {
      auto shared = with_schema ? std::make_shared<JsonMaskTable>(vocab, schema, JsonConstraintOptions{}, budget)
                                : std::make_shared<JsonMaskTable>(vocab, JsonConstraintOptions{}, budget);
      std::atomic<int64_t> masks{0}, mismatches{0};
      auto walk = [&](uint32_t seed) {
        std::mt19937 rng(seed);
        std::normal_distribution<float> normal;
        for (int trial = 0; trial < 30; ++trial) {
          JsonTokenConstraint c(shared);
          JsonTokenConstraint own = with_schema ? JsonTokenConstraint(vocab, schema) : JsonTokenConstraint(vocab);
          for (int step = 0; step < 40; ++step) {
            std::vector<float> logits(static_cast<size_t>(V));
            for (float& l : logits) l = normal(rng);
            std::vector<float> a = logits, b = logits;
            const int64_t left = c.mask(a.data(), V, ends);
            if (left != own.mask(b.data(), V, ends) || a != b) ++mismatches;
            ++masks;
            if (left == 0) break;
            const int32_t pick = static_cast<int32_t>(std::max_element(a.begin(), a.end()) - a.begin());
            if (pick == V - 1) break;
            c.advance(pick);
            own.advance(pick);
          }
        }
      };
      std::vector<std::thread> threads;
      for (uint32_t t = 0; t < 4; ++t) threads.emplace_back(walk, 11 + t);
      for (auto& t : threads) t.join();
      EXPECT_EQ(mismatches.load(), 0) << "budget " << budget << " schema " << with_schema;
      EXPECT_EQ(shared->computed() + shared->found(), masks.load());
      EXPECT_GT(shared->found(), 0);
      // A walk again, one of the four: every state it meets is kept, unless the budget dropped it.
      const int64_t computed = shared->computed(), before = masks.load();
      walk(12);
      EXPECT_EQ(mismatches.load(), 0);
      if (budget == 1) {
        EXPECT_LE(shared->kept(), 8u);  // the fewest a table keeps
        EXPECT_GT(shared->computed(), computed);
      } else {
        EXPECT_EQ(shared->computed(), computed) << "masks " << masks.load() - before;
      }
    }
  }
}

// 24 schemas (Pydantic's of nested, optional, literal, length-limited, numerically bounded,
// date-time/date/uuid and pattern-constrained, tuple-typed (prefixItems), set-typed (uniqueItems
// over literals, booleans and an enum) and recursive models, as written and made strict; a prefix
// followed by items of another type, a prefix with items false, a set of mixed literals;
// hand-written anyOf of objects sharing a key prefix, type lists, mixed enums, item bounds, open
// objects, an anyOf of a bounded number and a bounded integer, fractional bounds, an anyOf of
// ipv4, time and pattern strings) with 120 documents each, generated and mutated, classified by
// the jsonschema package with ECMAScript's pattern matching and the formats' regexes
// (tests/scripts/make_json_schema_fixtures.py).
TEST(JsonSchema, ReadsWhatJsonschemaValidates) {
  const json::Value fixture = json::parse_file(test::data_path("json-object") + "/schema_cases.json");
  size_t n = 0, valid = 0;
  for (const auto& s : fixture.as_array()) {
    const JsonSchema schema = JsonSchema::compile(*s.find("schema"));
    for (const auto& c : s.find("cases")->as_array()) {
      const std::string bytes = unhex(c.find("hex")->as_string());
      const bool want = c.find("valid")->as_bool();
      SchemaRecognizer r(&schema, permissive().whitespace());
      EXPECT_EQ(r.feed(bytes) && r.complete(), want) << s.find("schema")->dump() << "\n" << bytes;
      if (want) {
        ++valid;
        SchemaRecognizer p(&schema, permissive().whitespace());
        for (size_t i = 0; i < bytes.size(); ++i)
          ASSERT_TRUE(p.feed(static_cast<uint8_t>(bytes[i]))) << bytes << " at " << i;
      }
      ++n;
    }
  }
  EXPECT_EQ(n, 3360u);
  EXPECT_GE(valid, 1500u);
}

namespace {

// Whether the schema's recognizer takes `text` (as a prefix), and whether it is a whole value.
bool takes(const std::string& schema, const std::string& text) {
  const JsonSchema s = JsonSchema::compile(json::parse(schema));
  SchemaRecognizer r(&s);
  return r.feed(text);
}
bool whole(const std::string& schema, const std::string& text) {
  const JsonSchema s = JsonSchema::compile(json::parse(schema));
  SchemaRecognizer r(&s);
  return r.feed(text) && r.complete();
}

}  // namespace

// prefixItems: item i follows the i-th schema, those after the prefix follow items (false: none).
TEST(JsonSchema, PrefixItemsGiveEachItemItsSchema) {
  const char* pair = R"({"type": "array", "prefixItems": [{"type": "integer"}, {"enum": ["a", "b"]}],
                         "minItems": 2, "maxItems": 2})";
  EXPECT_TRUE(whole(pair, R"([1, "a"])"));
  EXPECT_FALSE(takes(pair, R"(["a")"));     // the first item is an integer
  EXPECT_FALSE(takes(pair, R"([1, 2)"));    // the second one of the enum
  EXPECT_FALSE(takes(pair, R"([1, "b",)"));  // no third
  EXPECT_FALSE(whole(pair, "[1]"));
  const char* open = R"({"prefixItems": [{"type": "string"}], "items": {"type": "boolean"}})";
  EXPECT_TRUE(whole(open, "[]"));  // prefixItems require nothing
  EXPECT_TRUE(whole(open, R"(["x", true, false])"));
  EXPECT_FALSE(takes(open, R"(["x", "y")"));
  EXPECT_FALSE(takes(open, "[true"));
  const char* closed = R"({"prefixItems": [{"type": "null"}], "items": false})";
  EXPECT_TRUE(whole(closed, "[null]"));
  EXPECT_FALSE(takes(closed, "[null,"));
  EXPECT_TRUE(whole(R"({"type": "array", "items": false})", "[]"));
  EXPECT_FALSE(takes(R"({"type": "array", "items": false})", "[1"));
  EXPECT_TRUE(whole(R"({"type": "array", "uniqueItems": false})", "[1, 1]"));
}

// uniqueItems over literals: each literal at most once, a literal already given is not begun
// unless another one continues it, and once every literal is given the array may only close.
TEST(JsonSchema, UniqueItemsTakeEachLiteralOnce) {
  const char* set = R"({"type": "array", "items": {"enum": ["x", "xy", 3]}, "uniqueItems": true})";
  EXPECT_TRUE(whole(set, R"(["x", "xy", 3])"));
  EXPECT_FALSE(whole(set, R"(["x", "x"])"));
  EXPECT_TRUE(takes(set, R"(["x", "x)"));     // still "xy"
  EXPECT_FALSE(takes(set, R"(["x", "x")"));   // "x" again
  EXPECT_FALSE(takes(set, R"([3, 3)"));
  EXPECT_FALSE(takes(set, R"(["x", 3, "xy",)"));  // nothing left to give
  EXPECT_TRUE(whole(set, "[]"));
  const char* flags = R"({"type": "array", "items": {"$ref": "#/$defs/B"}, "uniqueItems": true,
                          "$defs": {"B": {"type": "boolean"}}})";
  EXPECT_TRUE(whole(flags, "[true, false]"));
  EXPECT_FALSE(takes(flags, "[false, f"));
  EXPECT_TRUE(whole(R"({"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": false})", "[1, 1]"));
}

// Numeric bounds decide each digit: a prefix is taken while some continuation lies within the
// bounds, and the number may end only inside them (exact decimals: 0.1 is 0.1).
TEST(JsonSchema, NumericBoundsDecideEachDigit) {
  const char* teen = R"({"type": "integer", "minimum": 10, "maximum": 20})";
  EXPECT_TRUE(takes(teen, "1"));    // 10..19
  EXPECT_TRUE(takes(teen, "2"));    // 20
  EXPECT_FALSE(takes(teen, "3"));   // 3, 30..39, 300..: none within
  EXPECT_FALSE(takes(teen, "0"));
  EXPECT_FALSE(takes(teen, "-"));
  EXPECT_FALSE(takes(teen, "21"));
  EXPECT_FALSE(whole(teen, "1"));   // 1 itself is below
  EXPECT_TRUE(whole(teen, "15"));
  EXPECT_TRUE(whole(teen, "20"));
  EXPECT_FALSE(takes(teen, "1.5"));  // an integer
  const char* open01 = R"({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1})";
  EXPECT_TRUE(takes(open01, "0"));   // 0.5 may follow
  EXPECT_FALSE(whole(open01, "0"));  // but 0 is excluded
  EXPECT_FALSE(whole(open01, "0.0"));
  EXPECT_TRUE(takes(open01, "0.0"));  // 0.01
  EXPECT_TRUE(whole(open01, "0.999"));
  EXPECT_FALSE(takes(open01, "1"));
  EXPECT_FALSE(takes(open01, "-"));
  EXPECT_FALSE(takes(open01, "0.5e"));  // bounded: no exponent
  const char* tenth = R"({"type": "number", "minimum": 0.1, "maximum": 0.3})";
  EXPECT_TRUE(whole(tenth, "0.1"));  // the bound as written, not its binary double
  EXPECT_TRUE(whole(tenth, "0.3"));
  EXPECT_FALSE(whole(tenth, "0.30001"));
  EXPECT_FALSE(takes(tenth, "0.4"));
  EXPECT_TRUE(takes(tenth, "0.29"));
  const char* neg = R"({"type": "integer", "exclusiveMaximum": -2.5, "minimum": -1000})";
  EXPECT_TRUE(whole(neg, "-3"));
  EXPECT_FALSE(whole(neg, "-2"));
  EXPECT_TRUE(takes(neg, "-1"));      // -10.. -19, -100.. -199, -1000
  EXPECT_TRUE(whole(neg, "-1000"));
  EXPECT_FALSE(takes(neg, "-1001"));
  EXPECT_FALSE(takes(neg, "-0"));
  EXPECT_FALSE(takes(neg, "5"));
  const char* big = R"({"type": "integer", "minimum": 100000})";
  EXPECT_TRUE(takes(big, "9"));    // 900000 and more
  EXPECT_FALSE(whole(big, "99999"));
  EXPECT_TRUE(whole(big, "99999999999999999999999"));  // no upper bound, no size limit
  EXPECT_FALSE(takes(big, "-"));
}

TEST(JsonSchema, RefusesWhatItCannotEnforce) {
  auto refused = [](const char* schema, const char* part) {
    try {
      JsonSchema::compile(json::parse(schema));
      ADD_FAILURE() << "accepted: " << schema;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused(R"({"type": "object", "properties": {"a": {}}, "additionalProperties": false, "minProperties": 2})",
          "$: minProperties 2 exceeds the 1 keys additionalProperties false allows");
  refused(R"({"properties": {"a": {}}, "required": ["a"], "dependencies": {"a": ["b"]}, "maxProperties": 1})",
          "$: maxProperties 1 is below the keys required");
  refused(R"({"type": "object", "minProperties": 3, "maxProperties": 2})", "maxProperties is below minProperties");
  refused(R"({"properties": {"a": false}, "required": ["a"]})", "$: required names 'a', whose schema is false");
  refused(R"({"properties": {"a": {}}, "required": ["a"], "additionalProperties": false,
              "dependencies": {"a": {"properties": {"a": {"type": "string"}}, "required": ["b"]}}})",
          "$: required names 'b', which is not in properties and additionalProperties false forbids");
  refused(R"({"type": "object", "patternProperties": {"^a": {}}, "required": ["b"], "additionalProperties": false})",
          "$: required names 'b', which is not in properties and additionalProperties false forbids");
  refused(R"({"type": "object", "patternProperties": {"(a": {}}})", "$.patternProperties: pattern '(a'");
  refused(R"({"type": "object", "patternProperties": {"a": {"type": "string"}, "b": {"type": "integer"}}})",
          "$: patternProperties 'a' and 'b' may match one key and give it different schemas");
  refused(R"({"type": "object", "patternProperties": {"^a": {"type": "string"}, "^ab": {"type": "integer"}}})",
          "may match one key");
  refused(R"({"allOf": [{"prefixItems": [{"type": "string"}]}, {"items": {"type": "integer"}}]})",
          "allOf joining a tuple (prefixItems, items as a list) with other items is not supported");
  refused(R"({"allOf": [{"prefixItems": [{}]}, {"items": false}]})", "with other items is not supported");
  refused(R"({"allOf": [{"patternProperties": {"^x": {"type": "integer"}}}, {"additionalProperties": {"type": "string"}}]})",
          "allOf joining patternProperties with another schema's properties is not supported");
  refused(R"({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 5, "maximum": 100}}})",
          "$.properties.n: multipleOf beside maximum or exclusiveMaximum is not supported");
  refused(R"({"type": "number", "multipleOf": 0})", "$: multipleOf must be above 0");
  refused(R"({"type": "number", "multipleOf": 0.1, "minimum": -1})", "multipleOf beside a minimum below 0");
  refused(R"({"type": "number", "multipleOf": 1e-20})", "is not supported (a decimal of at most 12 digits is)");
  refused(R"({"type": "integer", "minimum": 1.2, "maximum": 1.8})", "no integer lies within its bounds");
  refused(R"({"type": "number", "exclusiveMinimum": 1, "maximum": 1})", "no number lies within its bounds");
  refused(R"({"type": "integer", "exclusiveMinimum": true})", "$: exclusiveMinimum true needs a minimum");
  refused(R"({"allOf": [{"type": "string"}, {"type": "integer"}]})", "$.allOf[1]: no type satisfies every schema");
  refused(R"({"allOf": [{"anyOf": [{"type": "string"}]}, {"oneOf": [{"type": "integer"}, {"type": "null"}]}]})",
          "no pair of the anyOf (oneOf) alternatives allOf joins admits a value");
  refused(R"({"anyOf": [{"type": "string"}], "oneOf": [{"type": "string"}], "allOf": [{}]})",
          "anyOf beside oneOf in one schema is not supported");
  refused(R"({"allOf": [{"pattern": "a"}, {"pattern": "b"}]})", "$.allOf[1]: allOf joins schemas whose 'pattern' differ");
  refused(R"({"allOf": [{"properties": {"a": {}}, "additionalProperties": false}, {"required": ["b"]}]})",
          "$: required names 'b', which is not in properties and additionalProperties false forbids");
  refused(R"({"allOf": [{"properties": {"a": {}}, "additionalProperties": false}, {"properties": {"b": {}}, "required": ["b"]}]})",
          "$.allOf[1]: required names 'b', which a schema allOf joins forbids");
  refused(R"({"const": "a", "enum": ["b"]})", "const is not one of enum's values");
  refused(R"({"enum": ["abc", "de"], "maxLength": 1})", "no enum or const value has the schema's type and bounds");
  refused(R"({"allOf": [{"$ref": "#"}]})", "nests deeper than");
  refused(R"({"properties": {"a": {"not": {"type": "null"}}}})", "$.properties.a: the keyword 'not' is not supported");
  refused(R"({"not": {"description": "nothing"}})", "$: not {} admits no value");
  refused(R"({"properties": {"a": {}}, "dependencies": {"a": ["b"]}, "additionalProperties": false})",
          "$.dependencies.a: names 'b', which additionalProperties false forbids");
  refused(R"({"if": {"type": "string"}, "then": {"minLength": 1}})", "the keyword 'if' is not supported");
  refused(R"({"$ref": "#/definitions/a/definitions/c", "definitions": {"a": {"definitions": {"b": {}}}}})",
          "names no definition");
  refused(R"({"$ref": "#/$defs/Missing"})", "names no definition");
  refused(R"({"$ref": "http://example.com/s.json"})", "is not supported");
  refused(R"({"type": "object", "required": ["x"], "additionalProperties": false})",
          "$: required names 'x', which is not in properties and additionalProperties false forbids");
  refused(R"({"type": "array", "items": [{"type": "string"}], "prefixItems": [{}]})", "items as a list beside prefixItems");
  refused(R"({"type": "array", "uniqueItems": true})", "$: uniqueItems true is supported for items that are strings");
  refused(R"({"type": "array", "items": {"type": "object"}, "uniqueItems": true})", "not these");
  refused(R"({"items": {"anyOf": [{"type": "string"}, {"type": "array"}]}, "uniqueItems": true})", "not these");
  refused(R"({"type": "array", "items": {"enum": [1, 1.0]}, "uniqueItems": true})", "lists one value twice (1, 1.0)");
  refused(R"({"items": {"enum": ["a"]}, "uniqueItems": true, "minItems": 2})",
          "$: minItems 2 exceeds the 1 distinct items uniqueItems allows");
  refused(R"({"prefixItems": []})", "$: prefixItems must be a non-empty list");
  refused(R"({"prefixItems": [{}], "items": false, "minItems": 2})",
          "$: minItems 2 exceeds the 1 items prefixItems and items false allow");
  refused(R"({"enum": [[1]]})", "lists or objects");
  refused(R"({"type": "date"})", "unknown type 'date'");
  refused("false", "admits no value");
  refused(R"({"type": "string", "minLength": 3, "maxLength": 2})", "maxLength is below minLength");
}

// What JSON Schema's validators read the same way: keywords it does not define are annotations
// (Kubernetes' x-kubernetes-*, draft 4's id, example, readonly, links, _format); draft 4's boolean
// exclusiveMinimum/exclusiveMaximum; a $ref anywhere into the schema; a required key that
// properties does not list takes the other keys' schema.
TEST(JsonSchema, ReadsWhatValidatorsReadAlike) {
  EXPECT_TRUE(whole(R"({"type": "object", "id": "http://x/y#", "x-kubernetes-preserve-unknown-fields": true,
                       "readonly": true, "example": {"a": "b"}, "links": [{"rel": "self"}], "self": {"vendor": "v"},
                       "properties": {"a": {"type": "string", "_format": "uri", "x-order": 1}},
                       "additionalProperties": false})",
                    R"({"a":"b"})"));
  EXPECT_FALSE(whole(R"({"type": "object", "x-foo": 1, "properties": {"a": {"type": "string"}},
                        "additionalProperties": false})", R"({"b":"c"})"));
  const char* above_zero = R"({"type": "number", "minimum": 0, "exclusiveMinimum": true, "maximum": 2})";
  EXPECT_FALSE(whole(above_zero, "0"));
  EXPECT_TRUE(whole(above_zero, "0.5"));
  EXPECT_TRUE(whole(above_zero, "2"));
  const char* below_three = R"({"type": "integer", "maximum": 3, "exclusiveMaximum": true, "minimum": 1,
                                "exclusiveMinimum": false})";
  EXPECT_FALSE(whole(below_three, "3"));
  EXPECT_TRUE(whole(below_three, "2"));
  EXPECT_TRUE(whole(below_three, "1"));
  const char* nested = R"({"definitions": {"a": {"definitions": {"b~/c": {"type": "integer"}}}},
                           "properties": {"x": {"$ref": "#/definitions/a/definitions/b~0~1c"},
                                          "y": {"$ref": "#/properties/x"},
                                          "z": {"$ref": "#/properties/w/prefixItems/1"},
                                          "w": {"prefixItems": [{"type": "string"}, {"type": "boolean"}]}},
                           "additionalProperties": false})";
  EXPECT_TRUE(whole(nested, R"({"x":5,"y":6,"z":true})"));
  EXPECT_FALSE(takes(nested, R"({"x":"5")"));
  EXPECT_FALSE(takes(nested, R"({"z":1)"));
  const char* required = R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"],
                             "additionalProperties": {"type": "string"}})";
  EXPECT_TRUE(whole(required, R"({"a":1,"b":"x"})"));
  EXPECT_TRUE(whole(required, R"({"b":"x","c":"y","a":1})"));
  EXPECT_FALSE(whole(required, R"({"a":1})"));
  EXPECT_FALSE(takes(required, R"({"a":1,"b":2)"));
  EXPECT_TRUE(whole(R"({"type": "object", "required": ["k"]})", R"({"k":[1,{"z":null}]})"));
  // patternProperties: a key its pattern matches takes its schema; a listed one both.
  const char* patterns = R"({"type": "object", "properties": {"ab": {"type": "string"}},
                             "patternProperties": {"^a": {"maxLength": 1}, "^x-": {"type": "integer"}},
                             "additionalProperties": {"type": "boolean"}})";
  EXPECT_TRUE(whole(patterns, R"({"ab":"c"})"));
  EXPECT_FALSE(takes(patterns, R"({"ab":"cd)"));
  EXPECT_TRUE(whole(patterns, R"({"aq":"q","x-y":1,"zz":true})"));
  EXPECT_FALSE(takes(patterns, R"({"x-y":"s)"));
  EXPECT_FALSE(takes(patterns, R"({"zz":1)"));
  EXPECT_TRUE(whole(patterns, R"({"x\u002dy":2})"));  // the key as read, escapes and all
  EXPECT_FALSE(takes(patterns, R"({"x\u002dy":true)"));
  EXPECT_TRUE(whole(patterns, R"({"\ud800":false})"));  // a lone surrogate: no pattern's, the other keys'
  EXPECT_FALSE(takes(patterns, R"({"\u0061b":1)"));  // "ab", escaped: still the listed key's schema
  EXPECT_FALSE(takes(R"({"type": "object", "properties": {"a": {"type": "integer"}}})", R"({"\u0061":"x)"));
  EXPECT_FALSE(whole(R"({"type": "object", "dependentRequired": {"a": ["b"]}})", R"({"\u0061":1})"));
  // Without a type, object and array keywords bind objects and arrays.
  EXPECT_FALSE(takes(R"({"patternProperties": {"^x": {"type": "integer"}}})", R"({"xa":"s)"));
  EXPECT_FALSE(whole(R"({"dependentRequired": {"a": ["b"]}})", R"({"a":1})"));
  EXPECT_FALSE(takes(R"({"uniqueItems": true, "items": {"enum": [1, 2]}})", "[1,1"));
  const char* attributes = R"({"type": "object", "properties": {"attributes": {"type": "object", "properties": {},
      "patternProperties": {"^.*$": {"type": "array", "items": {"properties": {"terms": {"type": "array",
      "items": {"type": "object", "properties": {"url": {"type": "string"}}}}}}}}}}})";
  EXPECT_FALSE(takes(attributes, R"({"attributes": {"x": [{"terms": [{"url": 1)"));
  EXPECT_FALSE(takes(attributes, R"({"attributes": {"x": 1)"));
  EXPECT_FALSE(takes(R"({"type": "object", "patternProperties": {"^.*$": {"type": "array"}}})", R"({"x": 1)"));
  EXPECT_FALSE(takes(R"({"type": "object", "patternProperties": {"^.*$": {"type": "array"}}})", R"({"x":1)"));
  // dependencies (drafts 4-7) and dependentRequired: a key given requires others.
  for (const char* key : {"dependencies", "dependentRequired"}) {
    const std::string deps = std::string(R"({"type": "object", "properties": {"card": {"type": "integer"},
                                             "billing": {"type": "string"}}, ")") + key +
                             R"(": {"card": ["billing", "cvv"]}, "additionalProperties": {"type": "integer"}})";
    EXPECT_TRUE(whole(deps, R"({"billing":"x"})")) << key;
    EXPECT_FALSE(whole(deps, R"({"card":1,"billing":"x"})")) << key;
    EXPECT_TRUE(whole(deps, R"({"card":1,"cvv":2,"billing":"x"})")) << key;
    EXPECT_FALSE(takes(deps, R"({"card":1,"cvv":"x)")) << key;
  }
  // (a key the object may not hold requires nothing)
  EXPECT_TRUE(whole(R"({"properties": {"a": {}}, "dependencies": {"z": ["a"]}, "additionalProperties": false})", R"({})"));
  // Without a type, a string's or number's keywords bind strings or numbers alone.
  EXPECT_TRUE(whole(R"({"format": "positiveInteger"})", "1"));
  EXPECT_TRUE(whole(R"({"pattern": "^a"})", "[1]"));
  EXPECT_TRUE(whole(R"({"pattern": "^a"})", R"("ab")"));
  EXPECT_FALSE(takes(R"({"pattern": "^a"})", R"("b)"));
  EXPECT_FALSE(takes(R"({"maximum": 3})", "4"));
  EXPECT_TRUE(whole(R"({"maximum": 3})", R"("4")"));
  EXPECT_TRUE(whole(R"({"additionalProperties": true})", R"("x")"));
  // A required key a pattern matches takes the pattern's schema, not the other keys'.
  EXPECT_FALSE(takes(R"({"required": ["x1"], "patternProperties": {"^x": {"type": "integer"}}})", R"({"x1":"a)"));
}

// allOf, and $ref, anyOf or oneOf beside other keywords (JSON Schema's allOf too), merged into one
// schema: the values every joined schema admits, never one that some refuses. Drafts 4 to 7's
// tuples (items as a list, additionalItems).
TEST(JsonSchema, JoinsWhatAllOfAndSiblingsJoin) {
  const char* both = R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                   {"properties": {"b": {"type": "string"}}, "required": ["b"]}]})";
  EXPECT_TRUE(whole(both, R"({"a":1,"b":"x"})"));
  EXPECT_FALSE(whole(both, R"({"a":1})"));
  EXPECT_FALSE(takes(both, R"({"b":2)"));
  const char* closed = R"({"allOf": [{"properties": {"a": {}}, "additionalProperties": false},
                                     {"properties": {"a": {"type": "integer"}, "b": {}}}]})";
  EXPECT_TRUE(whole(closed, R"({"a":1})"));
  EXPECT_FALSE(takes(closed, R"({"b)"));
  EXPECT_FALSE(takes(closed, R"({"a":"x)"));
  const char* open = R"({"allOf": [{"properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
                                   {"properties": {"b": {"maxLength": 1}}}]})";
  EXPECT_TRUE(whole(open, R"({"a":1,"b":"x","c":"y"})"));
  EXPECT_FALSE(takes(open, R"({"b":"xy)"));
  EXPECT_FALSE(takes(open, R"({"b":1)"));
  const char* bounds = R"({"allOf": [{"minimum": 0}, {"maximum": 5}, {"type": "integer"}, {"exclusiveMaximum": 5}]})";
  EXPECT_TRUE(whole(bounds, "3"));
  EXPECT_FALSE(whole(bounds, "5"));
  EXPECT_FALSE(takes(bounds, "-1"));
  const char* types = R"({"allOf": [{"type": ["string", "integer"]}, {"type": "number"}]})";
  EXPECT_TRUE(whole(types, "3"));
  EXPECT_FALSE(takes(types, "\"a"));
  EXPECT_FALSE(takes(types, "3."));
  const char* enums = R"({"allOf": [{"enum": ["a", "b", "c"]}, {"enum": ["b", "c", "d"]}, {"pattern": "^c"}]})";
  EXPECT_TRUE(whole(enums, "\"c\""));
  EXPECT_FALSE(takes(enums, "\"a"));
  EXPECT_FALSE(takes(enums, "\"b"));
  // A discriminated union as hand-written schemas put it: the shared part beside a oneOf.
  const char* tagged = R"({"type": "object", "properties": {"kind": {"enum": ["x", "y"]}}, "required": ["kind"],
                           "oneOf": [{"properties": {"kind": {"const": "x"}, "n": {"type": "integer"}}, "required": ["n"]},
                                     {"properties": {"kind": {"const": "y"}}}]})";
  EXPECT_TRUE(whole(tagged, R"({"kind":"x","n":1})"));
  EXPECT_FALSE(whole(tagged, R"({"kind":"x"})"));
  EXPECT_TRUE(whole(tagged, R"({"kind":"y"})"));
  EXPECT_FALSE(takes(tagged, R"({"kind":"z)"));
  // allOf over two anyOf (oneOf) lists: every pair joined, those no value satisfies left out.
  const char* pairs = R"({"allOf": [{"oneOf": [{"type": "string"}, {"type": "integer"}, {"const": true}]},
                                    {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "number", "minimum": 5},
                                               {"type": "boolean"}]}]})";
  EXPECT_TRUE(whole(pairs, R"("ab")"));
  EXPECT_FALSE(takes(pairs, R"("abc)"));
  EXPECT_TRUE(whole(pairs, "7"));
  EXPECT_FALSE(whole(pairs, "4"));
  EXPECT_FALSE(takes(pairs, "5.5"));  // integer and number: an integer
  EXPECT_TRUE(whole(pairs, "true"));
  EXPECT_FALSE(takes(pairs, "f"));    // false: not the const
  EXPECT_FALSE(takes(pairs, "n"));
  // A property whose schema is false: the key may not appear, others may.
  const char* no_x = R"({"allOf": [{"properties": {"x": false}}, {"properties": {"y": {"type": "integer"}}}]})";
  EXPECT_TRUE(whole(no_x, R"({"y": 1, "xy": 2})"));
  EXPECT_FALSE(takes(no_x, R"({"x":)"));
  EXPECT_FALSE(takes(no_x, R"({"x")"));
  EXPECT_TRUE(takes(no_x, R"({"x)"));  // "xy" may follow
  // not {} (false, as schemas write it), and not over a list of keys: one of them absent.
  const char* nots = R"({"properties": {"a": {"not": {}}, "b": {}, "c": {}}, "not": {"required": ["b", "c"]}})";
  EXPECT_FALSE(takes(nots, R"({"a")"));
  EXPECT_TRUE(whole(nots, R"({"b": 1, "d": 2})"));
  EXPECT_TRUE(whole(nots, R"({"c": 1})"));
  EXPECT_FALSE(whole(nots, R"({"b": 1, "c": 2})"));
  EXPECT_TRUE(whole(R"({"anyOf": [{"not": {}}, {"type": "null"}]})", "null"));
  // Schema dependencies (dependencies' schema form, dependentSchemas): with the key, the object
  // meets the key's schema too; without it, it need not.
  const char* site = R"({"type": "object", "properties": {"id": {"type": "string"}, "website": {"type": "string"},
                                                         "type": {"type": "string"}},
                         "additionalProperties": false, "required": ["id"],
                         "dependencies": {"website": {"properties": {"type": {"enum": ["section"]}}, "required": ["type"]}}})";
  EXPECT_TRUE(whole(site, R"({"id": "a", "type": "story"})"));
  EXPECT_TRUE(whole(site, R"({"id": "a", "website": "w", "type": "section"})"));
  EXPECT_FALSE(whole(site, R"({"id": "a", "website": "w"})"));                      // type required with website
  EXPECT_FALSE(takes(site, R"({"id": "a", "website": "w", "type": "story")"));
  EXPECT_FALSE(takes(site, R"({"id": "a", "type": "story", "website")"));         // once type is not "section"
  const char* open_dep = R"({"dependentSchemas": {"a": {"properties": {"b": {"type": "integer"}}}}})";
  EXPECT_TRUE(whole(open_dep, R"({"b": "x"})"));
  EXPECT_TRUE(whole(open_dep, R"({"a": 1, "b": 2})"));
  EXPECT_FALSE(whole(open_dep, R"({"a": 1, "b": "x"})"));
  // $ref beside keywords, into a recursive definition.
  const char* ref = R"({"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"},
                                                                             "v": {"type": "integer"}}}},
                        "$ref": "#/$defs/node", "required": ["v"]})";
  EXPECT_TRUE(whole(ref, R"({"v":1,"next":{"next":{}}})"));
  EXPECT_FALSE(whole(ref, R"({"next":{}})"));
  // Tuples as drafts 4 to 7 write them.
  const char* tuple = R"({"type": "array", "items": [{"type": "string"}, {"type": "integer"}], "additionalItems": false})";
  EXPECT_TRUE(whole(tuple, R"(["a",1])"));
  EXPECT_FALSE(takes(tuple, R"(["a",1,)"));
  EXPECT_FALSE(takes(tuple, R"([1)"));
  EXPECT_TRUE(whole(R"({"type": "array", "items": [{"type": "string"}], "additionalItems": {"type": "null"}})",
                    R"(["a",null,null])"));
  EXPECT_TRUE(whole(R"({"type": "array", "items": [{"type": "string"}]})", R"(["a",{"b":[1]}])"));
  EXPECT_TRUE(whole(R"({"type": "array", "additionalItems": false, "items": {"type": "integer"}})", "[1,2,3]"));
  // The same recursive schema twice: merged once, not to the nesting limit.
  EXPECT_TRUE(whole(R"({"$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}}},
                        "allOf": [{"$ref": "#/$defs/N"}, {"$ref": "#/$defs/N"}]})",
                    R"({"next":{"next":{}}})"));
  EXPECT_TRUE(whole(R"({"allOf": [{"properties": {"x": false}}, {"additionalProperties": false, "properties": {"y": {}}}]})",
                    R"({"y":1})"));
}

// A schema that would crash, or keep a CPU busy, a recognizer is refused at compile time naming
// the limit; each refusal comes from a bounded amount of work (no recursion past the limits).
TEST(JsonSchema, RefusesSchemasPastItsLimits) {
  auto refused = [](const std::string& schema, const char* part) {
    try {
      JsonSchema::compile(json::parse(schema));
      ADD_FAILURE() << "accepted: " << schema.substr(0, 200);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << std::string(e.what()).substr(0, 300);
    }
  };
  // $ref cycles that consume nothing on their way round.
  refused(R"({"$ref": "#"})", "$: the $ref cycle '#' comes back to where it began without consuming any text");
  refused(R"({"anyOf": [{"type": "string"}, {"$ref": "#"}]})", "the $ref cycle '#' comes back");
  refused(R"({"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"anyOf": [{"$ref": "#/$defs/A"}]}}, "$ref": "#/$defs/A"})",
          "the $ref cycle '#/$defs/A' -> '#/$defs/B' comes back");
  // Cycles through a value are recursion, not a loop: a tree of lists.
  EXPECT_TRUE(whole(R"({"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}}]})", "[1, [2, []]]"));
  // Chains and nesting past 64 levels.
  std::string chain = R"({"$ref": "#/$defs/d0", "$defs": {)";
  for (int i = 0; i < 8000; ++i) chain += "\"d" + std::to_string(i) + "\": {\"$ref\": \"#/$defs/d" + std::to_string(i + 1) + "\"}, ";
  chain += R"("d8000": {"type": "string"}}})";
  refused(chain, "nests deeper than 64 levels (each $ref followed counts one)");
  std::string nested;
  for (int i = 0; i < 100; ++i) nested += R"({"items": )";
  nested += "{}" + std::string(100, '}');
  refused(nested, "nests deeper than 64 levels");
  // Sizes: nodes, patterns, their states together.
  std::string wide = R"({"anyOf": [)";
  for (int i = 0; i < 10001; ++i) wide += std::string(i ? ", " : "") + R"({"type": "string"})";
  refused(wide + "]}", "more than 10000 nodes once compiled");
  std::string patterns = R"({"anyOf": [)";
  for (int i = 0; i < 65; ++i) patterns += std::string(i ? ", " : "") + R"({"type": "string", "pattern": "^a)" + std::to_string(i) + "$\"}";
  refused(patterns + "]}", "more than 64 distinct patterns and formats");
  std::string big = R"({"anyOf": [)";
  for (char c = 'a'; c < 'g'; ++c)
    big += std::string(c > 'a' ? ", " : "") + R"({"type": "string", "pattern": "^(?:)" + c + R"({1000}){9}$"})";
  refused(big + "]}", "the schema's patterns are too large together");
  // anyOf options that overlap and nest, doubling at each level: compiled, its worst case past
  // kMaxThreads (the recognizer then follows the first ones, a deep text still valid)...
  std::string doubling = R"({"$ref": "#/$defs/L0", "$defs": {)";
  for (int i = 0; i < 12; ++i) {  // 2^12 alternatives at the 12th level
    const std::string next = "{\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/L" + std::to_string(i + 1) + "\"}";
    doubling += "\"L" + std::to_string(i) + "\": {\"anyOf\": [" + next + "}, " + next + ", \"minItems\": 0}]}, ";
  }
  doubling += R"("L12": {"type": "string"}}})";
  EXPECT_GT(JsonSchema::compile(json::parse(doubling)).ambiguity(), SchemaLimits::kMaxThreads);
  EXPECT_TRUE(whole(doubling, R"([[[[[[[[[[[["deep"]]]]]]]]]]]])"));
  EXPECT_FALSE(takes(doubling, R"([[[[[[[[[[[[[)"));
  // ...but alternatives told apart by their keys (a recursive filter expression, as Pydantic
  // writes discriminated unions) never pile up, however deep they nest.
  const std::string expr = R"({"$ref": "#/$defs/E", "$defs": {"E": {"anyOf": [
      {"type": "object", "properties": {"and": {"type": "array", "items": {"$ref": "#/$defs/E"}}}, "required": ["and"],
       "additionalProperties": false},
      {"type": "object", "properties": {"or": {"type": "array", "items": {"$ref": "#/$defs/E"}}}, "required": ["or"],
       "additionalProperties": false},
      {"type": "object", "properties": {"field": {"type": "string"}, "value": {"type": "integer"}},
       "required": ["field", "value"], "additionalProperties": false}]}}})";
  EXPECT_TRUE(whole(expr, R"({"and": [{"or": [{"field": "a", "value": 1}]}, {"field": "b", "value": 2}]})"));
  EXPECT_LE(JsonSchema::compile(json::parse(expr)).ambiguity(), 3);
  // ...while the same $ref listed twice at each level is one alternative, followed once.
  std::string shared = R"({"$ref": "#/$defs/L0", "$defs": {)";
  for (int i = 0; i < 20; ++i) {
    const std::string next = "{\"$ref\": \"#/$defs/L" + std::to_string(i + 1) + "\"}";
    shared += "\"L" + std::to_string(i) + "\": {\"anyOf\": [" + next + ", " + next + "]}, ";
  }
  shared += R"("L20": {"type": "string", "maxLength": 3}}})";
  EXPECT_TRUE(whole(shared, "\"abc\""));
  EXPECT_FALSE(whole(shared, "\"abcd\""));
  // allOf over two recursive schemas that branch: merged level by level until the nesting limit.
  refused(R"({"$defs": {"B": {"properties": {"x": {"$ref": "#/$defs/B"}, "y": {"$ref": "#/$defs/B"}}, "required": ["x"]},
                        "C": {"properties": {"x": {"$ref": "#/$defs/C"}, "y": {"$ref": "#/$defs/C"}}, "required": ["y"]}},
              "allOf": [{"$ref": "#/$defs/B"}, {"$ref": "#/$defs/C"}]})",
          "nests deeper than 64 levels");
}

// Past SchemaLimits::kMaxThreads alternatives side by side, the recognizer follows the first
// ones: the text stays valid against the schema, the work per byte stays bounded.
TEST(JsonSchema, FollowsAtMostKMaxThreadsAlternatives) {
  std::string many = R"({"anyOf": [)";
  for (int i = 0; i < 200; ++i)
    many += std::string(i ? ", " : "") + R"({"type": "object", "properties": {"k)" + std::to_string(i) +
            R"(": {"type": "integer"}}, "required": ["k)" + std::to_string(i) + R"("], "additionalProperties": false})";
  many += "]}";
  EXPECT_EQ(JsonSchema::compile(json::parse(many)).ambiguity(), 200);
  static_assert(SchemaLimits::kMaxThreads == 128);
  EXPECT_TRUE(whole(many, R"({"k0": 1})"));
  EXPECT_TRUE(whole(many, R"({"k127": 1})"));
  EXPECT_FALSE(takes(many, R"({"k128")")) << "the 129th alternative is not followed";
  EXPECT_FALSE(whole(many, R"({"k0": 1, "k1": 2})"));
}

// Token masks under a schema are the tokens whose bytes the schema recognizer takes next, and
// masked decoding from random rows ends, when it ends, in a document the schema admits.
TEST(JsonSchema, TokenMasksFollowTheSchema) {
  auto schema = std::make_shared<const JsonSchema>(JsonSchema::compile(json::parse(
      R"({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"},
          "tag": {"enum": ["a", "b"]}}, "required": ["ok", "tag"], "additionalProperties": false})")));
  auto vocab = std::make_shared<JsonTokenConstraint::Vocabulary>(JsonTokenConstraint::Vocabulary{
      "{", "}", "\"", ":", ",", " ", "{\"", "\":", "\",", "ok", "n", "tag", "o", "k", "true", "false", "t", "1", "12",
      "-", ".", "5", "a", "b", "\"a\"", "\"b\"", "x", "r", "u", "e", "f", "l", "s", "g", ""});  // single letters: a real vocabulary has every
                                                                  // byte, so no prefix is a dead end
  const int32_t V = static_cast<int32_t>(vocab->size());
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  int completed = 0;
  for (int trial = 0; trial < 100; ++trial) {
    JsonTokenConstraint c(vocab, schema);
    SchemaRecognizer mirror(schema.get());
    std::string text;
    for (int step = 0; step < 40; ++step) {
      std::vector<float> logits(static_cast<size_t>(V));
      for (float& l : logits) l = normal(rng);
      const int64_t left = c.mask(logits.data(), V, {V - 1});
      int64_t count = 0;
      for (int32_t id = 0; id < V; ++id) {
        SchemaRecognizer r = mirror;
        const std::string& b = (*vocab)[static_cast<size_t>(id)];
        const bool want = id == V - 1 ? mirror.complete() : r.feed(b);
        ASSERT_EQ(!std::isinf(logits[static_cast<size_t>(id)]), want) << "id " << id << " after " << text;
        count += want;
      }
      ASSERT_EQ(left, count);
      ASSERT_GT(left, 0) << text;
      const int32_t pick = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (pick == V - 1) {
        ++completed;
        const json::Value v = json::parse(text);
        EXPECT_TRUE(v.find("ok") && v.find("ok")->is_bool() && v.find("tag")) << text;
        break;
      }
      c.advance(pick);
      ASSERT_TRUE(mirror.feed((*vocab)[static_cast<size_t>(pick)]));
      text += (*vocab)[static_cast<size_t>(pick)];
    }
  }
  EXPECT_GE(completed, 10);
}

// With many alternatives side by side (here 200, past kMaxThreads), a mask is computed one
// alternative at a time: it equals, token by token, "some alternative alone takes these bytes"
// fed a byte at a time, and decoding by it always advances and ends in a text of one alternative.
TEST(JsonSchema, MasksOverManyAlternativesAreTheirUnion) {
  std::string many = R"({"anyOf": [)";
  for (int i = 0; i < 200; ++i)
    many += std::string(i ? ", " : "") + R"({"type": "object", "properties": {"k)" + std::to_string(i) +
            R"(": {"type": "string", "maxLength": )" + std::to_string(1 + i % 3) + R"(}}, "required": ["k)" +
            std::to_string(i) + R"("], "additionalProperties": false})";
  many += "]}";
  auto schema = std::make_shared<const JsonSchema>(JsonSchema::compile(json::parse(many)));
  auto vocab = std::make_shared<JsonTokenConstraint::Vocabulary>(JsonTokenConstraint::Vocabulary{
      "{", "}", "\"", ":", " ", "{\"", "\":", "\": \"", "k", "k1", "k12", "1", "2", "3", "0", "9", "a", "ab", "abc",
      "\"}", "\\n", "\n", ""});
  const int32_t V = static_cast<int32_t>(vocab->size());
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  int completed = 0;
  for (int trial = 0; trial < 40; ++trial) {
    JsonTokenConstraint c(vocab, schema);
    SchemaRecognizer mirror(schema.get());
    std::string text;
    for (int step = 0; step < 30; ++step) {
      std::vector<float> logits(static_cast<size_t>(V));
      for (float& l : logits) l = normal(rng);
      c.mask(logits.data(), V, {V - 1});
      for (int32_t id = 0; id + 1 < V; ++id) {
        bool want = false;
        for (size_t a = 0; a < mirror.alternatives() && !want; ++a) {
          SchemaRecognizer one = mirror.alternative(a);
          bool ok = true;
          for (char ch : (*vocab)[static_cast<size_t>(id)]) ok = ok && one.feed(static_cast<uint8_t>(ch));
          want = ok;
        }
        ASSERT_EQ(!std::isinf(logits[static_cast<size_t>(id)]), want) << "id " << id << " after " << text;
      }
      const int32_t pick = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (pick == V - 1) {
        ++completed;
        const json::Value v = json::parse(text);
        ASSERT_EQ(v.as_object().size(), 1u) << text;
        break;
      }
      ASSERT_NO_THROW(c.advance(pick)) << text;
      ASSERT_TRUE(mirror.feed(std::string_view((*vocab)[static_cast<size_t>(pick)])));
      EXPECT_LE(mirror.alternatives(), static_cast<size_t>(SchemaLimits::kMaxThreads));
      text += (*vocab)[static_cast<size_t>(pick)];
    }
  }
  EXPECT_GE(completed, 5);
}

namespace {

std::u32string utf32(const std::string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    const int n = c < 0x80 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
    uint32_t cp = n == 0 ? c : c & (0x3F >> n);
    for (int k = 1; k <= n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + static_cast<size_t>(k)]) & 0x3F);
    out.push_back(cp);
    i += static_cast<size_t>(n) + 1;
  }
  return out;
}

}  // namespace

// Patterns of the ECMAScript subset and the formats' regexes against Python's `re` on 1927
// strings (tests/scripts/make_regex_fixtures.py), and the formats' regexes as the fixture
// specifies them.
TEST(Regex, MatchesWhatPythonsReMatches) {
  const json::Value fixture = json::parse(test::read_file(test::data_path("regex/cases.json")));
  size_t n = 0, matched = 0;
  for (const auto& p : fixture.as_array()) {
    if (const json::Value* formats = p.find("formats")) {
      for (const auto& [name, rx] : formats->as_object()) EXPECT_EQ(format_pattern(name), rx.as_string()) << name;
      EXPECT_EQ(format_pattern("uri"), "");
      continue;
    }
    const Regex rx(p.find("pattern")->as_string());
    for (const auto& c : p.find("cases")->as_array()) {
      const std::string text = c.find("text")->as_string();
      const bool want = c.find("match")->as_bool();
      EXPECT_EQ(rx.matches(utf32(text)), want) << rx.pattern() << " on '" << text << "'";
      matched += want;
      ++n;
    }
  }
  EXPECT_GE(n, 1900u);
  EXPECT_GE(matched, 150u);
}

TEST(Regex, RefusesWhatItDoesNotSupport) {
  auto refused = [](const char* pattern, const char* part) {
    try {
      Regex r(pattern);
      ADD_FAILURE() << "accepted: " << pattern;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused("(a)\\1", "backreferences");
  refused("a(?=b)", "lookahead");
  refused("\\bword", "word boundaries");
  refused("a^b", "only at the start and the end");
  refused("(^a|b)", "only at the start and the end");
  refused("a$b", "only at the start and the end");
  refused("(ab", "unclosed '('");
  refused("ab)", "unmatched ')'");
  refused("[abc", "unclosed '['");
  refused("a{3,2}", "m below n");
  refused("a{5000}", "above 1000");
  refused("*a", "nothing before it");
  refused("\\p{L}", "Unicode property");
  refused("[z-a]", "out of order");
  // What would take a parser or the memory down is refused by name, not run.
  refused("a{99999999999999999999}", "above 1000");
  refused("a{2,99999999999999999999}", "above 1000");
  const std::string deep = std::string(20000, '(') + "a" + std::string(20000, ')');
  try {
    Regex r(deep);
    ADD_FAILURE() << "accepted 20000 nested groups";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("groups nested more than 100 deep"), std::string::npos) << m.substr(0, 200);
    EXPECT_LT(m.size(), 200u) << "the pattern is shown shortened";
  }
  EXPECT_NO_THROW(Regex(std::string(100, '(') + "a" + std::string(100, ')')));
  refused("(?:a{1000}){1000}", "is too large");
}

// pattern and format in a schema: each character of the string goes through the regexes, the
// closing quote only where all of them accept; other formats are annotations.
TEST(JsonSchema, PatternAndFormatDecideEachCharacter) {
  const char* date = R"({"type": "string", "format": "date"})";
  EXPECT_TRUE(whole(date, "\"2024-02-29\""));
  EXPECT_TRUE(takes(date, "\"2024-1"));
  EXPECT_FALSE(takes(date, "\"2024-13"));
  EXPECT_FALSE(takes(date, "\"2024-02-29\"x"));
  EXPECT_FALSE(whole(date, "\"2024-02\""));  // the closing quote needs a whole date
  EXPECT_FALSE(takes(date, "\"2024-02-29 "));
  const char* code = R"({"type": "string", "pattern": "^[A-Z]{2}-[0-9]+$", "maxLength": 5})";
  EXPECT_TRUE(whole(code, "\"AB-12\""));
  EXPECT_FALSE(takes(code, "\"AB-123"));  // maxLength too
  EXPECT_FALSE(takes(code, "\"ab"));
  EXPECT_FALSE(takes(code, "\"A\\u0042"));  // no \u escapes under a pattern
  const char* quote = R"({"type": "string", "pattern": "^\"[a-z]+\"$"})";
  EXPECT_TRUE(whole(quote, "\"\\\"hi\\\"\""));  // escapes are the characters they stand for
  const char* search = R"({"type": "string", "pattern": "é+"})";
  EXPECT_TRUE(whole(search, "\"caf\xc3\xa9!\""));  // unanchored: anywhere in the text
  EXPECT_FALSE(whole(search, "\"cafe\""));
  EXPECT_TRUE(whole(R"({"type": "string", "format": "uri"})", "\"not a uri\""));  // an annotation
  const char* both = R"({"type": "string", "format": "email", "pattern": "\\.org$"})";
  EXPECT_TRUE(whole(both, "\"a@b.org\""));
  EXPECT_FALSE(whole(both, "\"a@b.com\""));
  try {
    JsonSchema::compile(json::parse(R"({"properties": {"s": {"type": "string", "pattern": "(a"}}})"));
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("$.properties.s: pattern '(a': an unclosed '('"), std::string::npos) << e.what();
  }
}

// A pattern whose determinized states explode (the 16th character from the end must be 'a')
// keeps its memory bounded: past the cap new states are refused, known ones still work.
TEST(Regex, DeterminizedStatesAreCapped) {
  const Regex rx("a[ab]{15}$");
  std::mt19937 rng(5);
  std::u32string text;
  int dead = 0;
  EXPECT_FALSE(rx.saturated());
  for (int i = 0; i < 200000 && dead == 0; ++i) {
    int s = rx.start();
    for (int k = 0; k < 40 && s >= 0; ++k) s = rx.step(s, (rng() & 1) ? U'a' : U'b');
    dead += s < 0;
  }
  EXPECT_EQ(dead, 1) << "2^16 suffixes need more states than the cap";
  EXPECT_TRUE(rx.saturated());  // (a worker then compiles the schema that holds it afresh)
  int s = rx.start();  // states made before the cap still answer, past the lock-free first 4096 too
  for (char32_t c : std::u32string(U"aba")) s = rx.step(s, static_cast<uint32_t>(c));
  EXPECT_GE(s, 0);
  // Its schema says so, for the worker that keeps it.
  const JsonSchema schema = JsonSchema::compile(json::parse(R"({"type": "string", "pattern": "a[ab]{15}$"})"));
  EXPECT_FALSE(schema.saturated());
  ASSERT_EQ(schema.node(schema.root()).regexes.size(), 1u);
  const Regex& in_schema = *schema.node(schema.root()).regexes[0];
  for (int i = 0; i < 200000 && !in_schema.saturated(); ++i) {
    int st = in_schema.start();
    for (int k = 0; k < 40 && st >= 0; ++k) st = in_schema.step(st, (rng() & 1) ? U'a' : U'b');
  }
  EXPECT_TRUE(schema.saturated());
}

// A character begun under a pattern (a byte-level token may end inside one) is taken only when
// some character it may become continues the pattern.
TEST(JsonSchema, PatternTakesABegunCharacterOnlyIfItMayContinue) {
  const char* ascii = R"({"type": "string", "pattern": "^[a-z]+$"})";
  EXPECT_FALSE(takes(ascii, "\"ab\xe2"));       // no 3-byte character is a lowercase letter
  EXPECT_FALSE(takes(ascii, "\"ab\xc3"));
  // E0 and F0 carry no bits of their own, yet begin U+0800 and U+10000 onwards: not ASCII (the
  // reply that ended on a lone F0 under ^[a-f]-[a-f]$, the next byte having nothing valid).
  EXPECT_FALSE(takes(ascii, "\"ab\xe0"));
  EXPECT_FALSE(takes(ascii, "\"ab\xf0"));
  EXPECT_FALSE(takes(R"({"type": "string", "pattern": "^[a-f]-[a-f]$"})", "\"a-\xf0"));
  EXPECT_FALSE(takes(R"({"type": "string", "pattern": "^[a-f]-[a-f]$"})", "\"\xe0"));
  EXPECT_TRUE(takes(R"({"type": "string", "pattern": "^\u0800+$"})", "\"\xe0"));
  EXPECT_TRUE(whole(R"({"type": "string", "pattern": "^\u0800+$"})", "\"\xe0\xa0\x80\""));
  EXPECT_FALSE(takes(R"({"type": "string", "pattern": "^[\u0020-\u07ff]+$"})", "\"\xe0"));
  EXPECT_TRUE(takes("{\"type\": \"string\", \"pattern\": \"^\xf0\x9f\x98\x80$\"}", "\"\xf0"));  // U+1F600
  EXPECT_FALSE(takes(R"({"type": "string", "pattern": "^[\u0020-\uffff]$"})", "\"\xf0"));
  const char* accents = R"({"type": "string", "pattern": "^[a-z\u00e0-\u00ff]+$"})";
  EXPECT_TRUE(takes(accents, "\"caf\xc3"));     // U+00C0..U+00FF begins with C3
  EXPECT_TRUE(whole(accents, "\"caf\xc3\xa9\""));
  EXPECT_FALSE(takes(accents, "\"caf\xc3\x80"));  // U+00C0 is not in the class
  EXPECT_FALSE(takes(accents, "\"caf\xe4"));
  EXPECT_TRUE(takes(R"({"type": "string", "pattern": "^\u4e00+$"})", "\"\xe4\xb8"));  // on its way to U+4E00
  // An escape begun likewise: only where a character it may stand for continues the pattern.
  EXPECT_FALSE(takes(ascii, "\"ab\\"));
  EXPECT_TRUE(takes(R"({"type": "string", "pattern": "^[a-z\n]+$"})", "\"ab\\"));
}

// A mask allows only tokens after which the text can still be finished: with every byte a token
// (a real vocabulary has them all), decoding by random logits never reaches a state that allows
// nothing, and what it ends on (the end id, allowed only then) is valid. Each schema once had, or
// is near, a dead end: an empty closed object (`{"` took), patterns of ASCII (a lone E0 or F0
// took), a character begun at maxLength, bounds a digit can cross, literals taken once.
TEST(JsonSchema, MasksNeverLeadWhereNothingValidFollows) {
  auto vocab = std::make_shared<JsonTokenConstraint::Vocabulary>();
  for (int b = 1; b < 256; ++b) vocab->push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"{\"", "\":", "\",", "\xc3\xa9", "\xf0\x9f\x98\x80", "\xe4\xb8\x80", "ab", "-1", "0.", "}"})
    vocab->push_back(t);
  vocab->push_back("");  // the end id
  const int32_t V = static_cast<int32_t>(vocab->size());
  const char* schemas[] = {
      R"({"type": "object", "properties": {}, "additionalProperties": false})",
      R"({"type": "string", "pattern": "^[a-f]-[a-f]$"})",
      R"({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-f0-9]{4}-[a-f]$"}},
          "required": ["id"], "additionalProperties": false})",
      R"({"type": "string", "pattern": "^[a-z\u00e0-\u00ff]{1,3}$"})",
      R"({"type": "string", "maxLength": 2})",
      R"({"type": "integer", "minimum": -3, "maximum": 12})",
      R"({"type": "number", "exclusiveMinimum": 0.5, "maximum": 2})",
      R"({"type": "array", "items": {"enum": ["x", 1, null]}, "uniqueItems": true, "maxItems": 3})",
      R"({"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2})",
      R"({"type": "number", "multipleOf": 0.25, "minimum": 0.25})",
      R"({"type": "number", "multipleOf": 2, "exclusiveMinimum": 0.5})",
      R"({"type": "integer", "multipleOf": 7})",
      R"({"type": "object", "properties": {"a": {}}, "patternProperties": {"^(a|b)$": {"const": 1}},
          "additionalProperties": false})",
      R"({"type": "object", "patternProperties": {"^[ab]$": {"type": "null"}}, "additionalProperties": false,
          "minProperties": 2})",
      R"({"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "dependencies": {"a": ["b", "c"]},
          "additionalProperties": false, "minProperties": 1, "maxProperties": 2})",
      R"({"anyOf": [{"type": "object", "properties": {"a": {"const": 1}}, "required": ["a"], "additionalProperties": false},
                    {"type": "object", "properties": {"ab": {"type": "string", "format": "date"}},
                     "additionalProperties": false}]})",
  };
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (const char* text_of_schema : schemas) {
    auto schema = std::make_shared<const JsonSchema>(JsonSchema::compile(json::parse(text_of_schema)));
    int ended = 0;
    for (int trial = 0; trial < 60; ++trial) {
      JsonTokenConstraint c(vocab, schema, JsonConstraintOptions{});
      std::string text;
      for (int step = 0; step < 48; ++step) {
        std::vector<float> logits(static_cast<size_t>(V));
        for (float& l : logits) l = normal(rng);
        logits[static_cast<size_t>(V - 1)] += step / 8.0f;  // the end, likelier as the text grows
        const int64_t left = c.mask(logits.data(), V, {V - 1});
        ASSERT_GT(left, 0) << text_of_schema << ": nothing may follow " << text;
        const int32_t pick = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        if (pick == V - 1) {
          ASSERT_TRUE(c.complete()) << text;
          EXPECT_NO_THROW(json::parse(text)) << text;
          ++ended;
          break;
        }
        c.advance(pick);
        text += (*vocab)[static_cast<size_t>(pick)];
      }
    }
    EXPECT_GE(ended, 1) << text_of_schema;
  }
}

// Beside additionalProperties false, a key is a listed property or one a pattern matches, each
// given once; a key may begin only where a key not given yet can follow.
TEST(JsonSchema, AClosedObjectTakesTheKeysItsPatternsMatch) {
  const char* tags = R"({"type": "object", "properties": {"id": {"type": "integer"}},
                         "patternProperties": {"^x-[a-z]+$": {"type": "string"}, "^a[bc]$": {"type": "null"}},
                         "additionalProperties": false})";
  EXPECT_TRUE(whole(tags, R"({"id": 1, "x-vendor": "v", "ab": null, "ac": null})"));
  EXPECT_TRUE(takes(tags, R"({"x-)"));
  EXPECT_FALSE(takes(tags, R"({"y)"));           // neither a property nor a pattern's key
  EXPECT_FALSE(takes(tags, R"({"x-1)"));
  EXPECT_FALSE(whole(tags, R"({"x-": "v"})"));   // a key the pattern does not match whole
  EXPECT_FALSE(takes(tags, R"({"x-a": 1)"));      // the pattern's schema
  EXPECT_FALSE(takes(tags, R"({"x-a": "v", "x-a")"));  // a key given twice
  EXPECT_FALSE(takes(tags, R"({"ab": null, "ab")"));
  // Once "ab" and "ac" are given, the pattern ^a[bc]$ has nothing left: "a" cannot begin a key.
  EXPECT_TRUE(takes(tags, R"({"ab": null, "a)"));
  EXPECT_FALSE(takes(tags, R"({"ab": null, "ac": null, "a)"));
  // Patterns that match no key alike may give their keys different schemas.
  const char* paths = R"({"patternProperties": {"^/": {"type": "integer"}, "^[^/]": {"type": "string"}}})";
  EXPECT_TRUE(whole(paths, R"({"/a": 1, "b": "c"})"));
  EXPECT_FALSE(takes(paths, R"({"/a": "x")"));
  EXPECT_TRUE(Regex::disjoint(Regex("^/"), Regex("^[^/]")));
  EXPECT_TRUE(Regex::disjoint(Regex("^x-[a-z]+$"), Regex("^a[bc]$")));
  EXPECT_TRUE(Regex::disjoint(Regex("^[0-9]+$"), Regex("^[a-z]+$")));
  EXPECT_FALSE(Regex::disjoint(Regex("^a"), Regex("^ab")));
  EXPECT_FALSE(Regex::disjoint(Regex("a"), Regex("b")));   // "ab"
  EXPECT_FALSE(Regex::disjoint(Regex("^a|b"), Regex("^c")));  // "cb"
  // A key given counts only against the patterns that match it.
  const char* xy = R"({"patternProperties": {"^x$": {}, "^y$": {}}, "additionalProperties": false, "minProperties": 2})";
  EXPECT_TRUE(takes(xy, R"({"x": 1,)"));
  EXPECT_TRUE(whole(xy, R"({"x": 1, "y": 2})"));
  EXPECT_FALSE(takes(xy, R"({"x": 1, "x)"));
  // Nothing but the patterns' keys, all given: no key may begin.
  const char* two = R"({"type": "object", "patternProperties": {"^[ab]$": {}}, "additionalProperties": false})";
  EXPECT_TRUE(whole(two, R"({"a": 1, "b": 2})"));
  EXPECT_FALSE(takes(two, R"({"a": 1, "b": 2, ")"));
  EXPECT_FALSE(takes(two, R"({"a": 1, "b": 2,)"));
}

// An object of up to SchemaLimits::kMaxProperties keys (Snowplow's event schemas list 131).
TEST(JsonSchema, ObjectsListHundredsOfKeys) {
  std::string wide = R"({"type": "object", "additionalProperties": false, "required": ["k199"], "properties": {)";
  for (int i = 0; i < 200; ++i) wide += std::string(i ? ", " : "") + "\"k" + std::to_string(i) + "\": {\"type\": \"integer\"}";
  wide += "}}";
  EXPECT_TRUE(whole(wide, R"({"k150": 1, "k199": 2, "k0": 3})"));
  EXPECT_FALSE(whole(wide, R"({"k150": 1})"));                 // k199 is required
  EXPECT_FALSE(takes(wide, R"({"k150": 1, "k150")"));          // given twice
  EXPECT_FALSE(takes(wide, R"({"k200")"));
  std::string past = R"({"properties": {)";
  for (size_t i = 0; i <= SchemaLimits::kMaxProperties; ++i) past += std::string(i ? ", " : "") + "\"k" + std::to_string(i) + "\": {}";
  try {
    JsonSchema::compile(json::parse(past + "}}"));
    ADD_FAILURE() << "accepted " << SchemaLimits::kMaxProperties + 1 << " properties";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than 256 properties are not supported"), std::string::npos) << e.what();
  }
}

// minProperties and maxProperties count the keys given, each once; the keys a key requires count
// before it is taken.
TEST(JsonSchema, PropertyCountsHoldBetweenTheirBounds) {
  const char* some = R"({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2,
                         "maxProperties": 3})";
  EXPECT_FALSE(whole(some, R"({"a": 1})"));
  EXPECT_FALSE(takes(some, R"({"a": 1})"));   // may not close
  EXPECT_TRUE(whole(some, R"({"a": 1, "b": 2})"));
  EXPECT_TRUE(whole(some, R"({"a": 1, "b": 2, "c": 3})"));
  EXPECT_FALSE(takes(some, R"({"a": 1, "b": 2, "c": 3,)"));
  EXPECT_FALSE(takes(some, R"({"a": 1, "a")"));  // counted once: a key given twice is refused
  EXPECT_TRUE(takes(some, R"({"a": 1, "ab")"));
  const char* deps = R"({"properties": {"a": {}, "b": {}, "c": {}}, "dependencies": {"a": ["b", "c"]},
                         "maxProperties": 2})";
  EXPECT_FALSE(takes(deps, R"({"a")"));  // a needs b and c: three keys
  EXPECT_TRUE(whole(deps, R"({"b": 1, "c": 2})"));
  EXPECT_TRUE(whole(deps, R"({"b": 1, "d": 2})"));
  EXPECT_FALSE(takes(deps, R"({"b": 1, "d": 2, )"));
  EXPECT_TRUE(whole(R"({"maxProperties": 1})", R"({"z": [1]})"));
  // The one key maxProperties leaves is the required one.
  EXPECT_FALSE(takes(R"({"required": ["a"], "maxProperties": 1})", R"({"b)"));
  EXPECT_TRUE(whole(R"({"required": ["a"], "maxProperties": 1})", R"({"a": 2})"));
  // A forbidden key counts for nothing: two keys cannot be given.
  EXPECT_THROW(JsonSchema::compile(json::parse(
                   R"({"properties": {"a": {}, "b": false}, "additionalProperties": false, "minProperties": 2})")),
               Error);
  EXPECT_FALSE(takes(R"({"minProperties": 1})", "{}"));
}

// multipleOf: the value divided by it an integer, decided digit by digit (a fraction digit only
// where a multiple can still follow, within a lower bound).
TEST(JsonSchema, MultipleOfDecidesEachDigit) {
  const char* quarter = R"({"type": "number", "multipleOf": 0.25, "minimum": 0.25})";
  EXPECT_TRUE(whole(quarter, "1.75"));
  EXPECT_TRUE(whole(quarter, "0.5"));
  EXPECT_TRUE(whole(quarter, "3"));
  EXPECT_FALSE(whole(quarter, "0"));      // below the minimum
  EXPECT_FALSE(takes(quarter, "1.3"));    // no multiple begins so
  EXPECT_TRUE(takes(quarter, "1.2"));     // 1.25
  EXPECT_FALSE(takes(quarter, "1.255"));
  EXPECT_FALSE(takes(quarter, "1e"));     // written without an exponent
  EXPECT_FALSE(takes(quarter, "0.1"));    // 0.1x is below 0.25 or no multiple
  EXPECT_TRUE(takes(quarter, "0.2"));
  const char* cents = R"({"type": "number", "multipleOf": 0.01})";
  EXPECT_TRUE(whole(cents, "19.99"));
  EXPECT_TRUE(whole(cents, "-0.5"));
  EXPECT_FALSE(takes(cents, "19.999"));
  const char* even = R"({"type": "number", "multipleOf": 2, "exclusiveMinimum": 0.5})";
  EXPECT_TRUE(whole(even, "14"));
  EXPECT_FALSE(whole(even, "13"));
  EXPECT_TRUE(takes(even, "13"));    // 130
  EXPECT_FALSE(takes(even, "0"));    // 0 is excluded, and no fraction may follow
  EXPECT_FALSE(takes(even, "4."));
  const char* sevens = R"({"type": "integer", "multipleOf": 7})";
  EXPECT_TRUE(whole(sevens, "-49"));
  EXPECT_FALSE(whole(sevens, "50"));
  EXPECT_TRUE(whole(R"({"type": "integer", "multipleOf": 0.5})", "3"));
  EXPECT_TRUE(whole(R"({"enum": [1, 2.5, 3], "multipleOf": 1.5})", "3"));
  EXPECT_FALSE(takes(R"({"enum": [1, 2.5, 3], "multipleOf": 1.5})", "1"));
}

// uniqueItems over strings and numbers: each value once, compared as JSON Schema compares them.
TEST(JsonSchema, UniqueItemsTakeEachValueOnce) {
  const char* tags = R"({"type": "array", "items": {"type": "string"}, "uniqueItems": true})";
  EXPECT_TRUE(whole(tags, R"(["a", "b", "ab"])"));
  EXPECT_FALSE(takes(tags, R"(["a", "a")"));
  EXPECT_TRUE(takes(tags, R"(["a", "a)"));           // "ab" may follow
  EXPECT_FALSE(takes(tags, R"(["a", "a")"));    // the same string, escaped
  EXPECT_FALSE(takes(tags, "[["));                   // items are strings
  const char* nums = R"({"type": "array", "items": {"anyOf": [{"type": "number"}, {"type": "string"}]}, "uniqueItems": true})";
  EXPECT_TRUE(whole(nums, R"([1, "1", 2.5, -1])"));
  EXPECT_FALSE(takes(nums, "[1, 1.0,"));              // one value
  EXPECT_FALSE(takes(nums, "[100, 1e2]"));
  EXPECT_TRUE(takes(nums, "[1, 10"));
  EXPECT_FALSE(takes(nums, "[1e"));  // compared by digits: no exponent
  // A literal given may not begin again; an item that recurses is no scalar.
  const char* many = R"({"items": {"enum": ["a", "b", 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                                             21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
                                             41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60,
                                             61, 62, 63, 64]}, "uniqueItems": true})";
  EXPECT_TRUE(whole(many, R"(["a", "b", 64])"));
  EXPECT_TRUE(takes(many, R"(["a", ")"));  // "b" may follow
  EXPECT_FALSE(takes(many, R"(["a", "a)"));
  EXPECT_THROW(JsonSchema::compile(json::parse(
                   R"({"$ref": "#/$defs/A", "$defs": {"A": {"type": "array", "uniqueItems": true, "items": {"$ref": "#/$defs/A"}}}})")),
               Error);
  EXPECT_TRUE(whole(R"({"prefixItems": [{"const": "x"}], "items": {"type": "string"}, "uniqueItems": true})",
                    R"(["x", "y"])"));
  EXPECT_FALSE(takes(R"({"prefixItems": [{"const": "x"}], "items": {"type": "string"}, "uniqueItems": true})",
                     R"(["x", "x")"));
}

// At maxLength, a character may not begin (a lead byte, a backslash): it could not be finished.
TEST(JsonSchema, MaxLengthRefusesABegunCharacterItCannotHold) {
  const char* two = R"({"type": "string", "maxLength": 2})";
  EXPECT_TRUE(takes(two, "\"a\xc3"));
  EXPECT_FALSE(takes(two, "\"ab\xc3"));
  EXPECT_FALSE(takes(two, "\"ab\\"));
  EXPECT_TRUE(whole(two, "\"a\\n\""));
  EXPECT_TRUE(whole(two, "\"\xc3\xa9\xc3\xa9\""));
}

namespace {
// A real vocabulary (Qwen2.5's 151,665 tokens) and tokens it lacks that masks must still decide:
// string text of 70 and 100 characters (past VocabularyIndex::kFitsMax), UTF-8 begun and not
// finished, a continuation byte alone, control bytes, bytes two ids share, special tokens.
std::shared_ptr<JsonTokenConstraint::Vocabulary> real_vocabulary() {
  const Tokenizer tok = Tokenizer::load(test::data_path("qwen2-tokenizer"));
  auto vocab = std::make_shared<JsonTokenConstraint::Vocabulary>();
  for (int32_t t = 0; t < tok.size(); ++t) vocab->push_back(tok.token_bytes(t, true));
  for (const std::string& extra : std::vector<std::string>{std::string(70, 'a'), std::string(100, 'b') + "\"", "\xe6", "\xe6\x9d", "ab\xf0\x9f",
                            "\xc3\xa9\xe6", "\x9d", "\x01", "a\x1f", "{", "\"", "", ""})
    vocab->push_back(extra);
  return vocab;
}

// The reference: each id's bytes fed alone to a copy of the recognizer (one alternative at a
// time, as SchemaRecognizer::feed takes a token), a token whose first byte is refused skipped.
template <class Rec>
std::vector<bool> fed_alone(const Rec& rec, const JsonTokenConstraint::Vocabulary& vocab) {
  std::vector<bool> out(vocab.size(), false);
  std::vector<Rec> alts;
  if constexpr (std::is_same_v<Rec, SchemaRecognizer>) {
    for (size_t a = 0; a < rec.alternatives(); ++a) alts.push_back(rec.alternative(a));
  } else {
    alts.push_back(rec);
  }
  for (const Rec& one : alts) {
    bool first_ok[256];
    for (int b = 0; b < 256; ++b) {
      Rec r = one;
      first_ok[b] = r.feed(static_cast<uint8_t>(b));
    }
    for (size_t id = 0; id < vocab.size(); ++id) {
      const std::string& b = vocab[id];
      if (out[id] || b.empty() || !first_ok[static_cast<uint8_t>(b[0])]) continue;
      Rec r = one;
      out[id] = r.feed(std::string_view(b));
    }
  }
  return out;
}
}  // namespace

// Masks over a real vocabulary, computed by walking its token trie with string text decided by
// length (VocabularyIndex) and a pattern's string text by the string alone
// (SchemaRecognizer::string_alone), equal the tokens fed one by one, in the states random decoding
// meets under json_object, a schema of bounded, patterned, enumerated and alternative strings,
// one of open objects (any key) under maxProperties and one of pattern keys, some over fewer ids
// than the vocabulary.
TEST(JsonObject, MasksOverARealVocabularyAreEachTokenFedAlone) {
  const auto vocab = real_vocabulary();
  const int32_t V = static_cast<int32_t>(vocab->size());
  auto schema = std::make_shared<const JsonSchema>(JsonSchema::compile(json::parse(R"({
      "type": "object", "additionalProperties": false, "required": ["a", "b"],
      "properties": {"a": {"type": "string", "maxLength": 2}, "b": {"type": "string", "minLength": 3, "maxLength": 80},
        "c": {"anyOf": [{"type": "string", "pattern": "^[a-z \u00e9]+$"}, {"type": "integer", "minimum": 10}]},
        "d": {"type": "array", "items": {"type": "string", "maxLength": 4}, "uniqueItems": true},
        "e": {"enum": ["x", "xy", 3]}, "f": {"type": "object"}}})")));
  // Open objects (any key, while maxProperties leaves room), values under a pattern with `.`.
  auto open = std::make_shared<const JsonSchema>(JsonSchema::compile(json::parse(R"({
      "type": "array", "minItems": 3, "items": {"type": "object", "maxProperties": 3, "properties": {"m": {"type": "string",
        "pattern": "^(.+)/(.+)$"}}, "additionalProperties": {"anyOf": [{"type": "string", "pattern": "^.{2,}$"},
        {"type": "object"}]}}})")));
  // A closed object whose keys are its patterns' (read a step per character, keys_stepped).
  auto patterned = std::make_shared<const JsonSchema>(JsonSchema::compile(json::parse(R"({
      "type": "object", "additionalProperties": false, "minProperties": 2, "patternProperties": {
        "^[A-Z_]+$": {"type": "integer"}, "^\\.[a-zé]+$": {"type": "string", "maxLength": 3}}})")));
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  int masks = 0;
#if defined(__SANITIZE_ADDRESS__)
  constexpr int kTrials = 1;  // (the reference feeds all 151,665 tokens per mask: 100 s under ASan at 3)
#else
  constexpr int kTrials = 3;
#endif
  for (auto under : {std::shared_ptr<const JsonSchema>(), schema, open, patterned}) {
    const bool with_schema = under != nullptr;
    const JsonMaskTable facts(vocab);
    auto table = facts.sibling(under, JsonConstraintOptions{});
    for (int trial = 0; trial < kTrials; ++trial) {
      JsonTokenConstraint c(table);
      JsonRecognizer plain_mirror;
      SchemaRecognizer schema_mirror(with_schema ? under.get() : schema.get());
      std::string text;
      for (int step = 0; step < 40; ++step) {
        std::vector<float> logits(static_cast<size_t>(V));
        for (float& l : logits) l = normal(rng);
        // Every third mask over fewer ids than the vocabulary holds (a model's padded or cut
        // vocabulary): those past it are left as they are.
        const int32_t valid = step % 3 == 2 ? V - 7001 : V;
        c.mask(logits.data(), valid, {V - 1});
        const std::vector<bool> want =
            with_schema ? fed_alone(schema_mirror, *vocab) : fed_alone(plain_mirror, *vocab);
        ++masks;
        for (int32_t id = 0; id + 1 < V; ++id)
          ASSERT_EQ(!std::isinf(logits[static_cast<size_t>(id)]), id >= valid || want[static_cast<size_t>(id)])
              << "id " << id << " (" << (*vocab)[static_cast<size_t>(id)] << ") after " << text;
        // Two picks in three among the short tokens allowed (quotes, commas, a character): into
        // and out of strings, near their bounds; else the highest logit.
        std::vector<int32_t> short_ones;
        for (int32_t id = 0; id + 1 < valid; ++id)
          if (want[static_cast<size_t>(id)] && (*vocab)[static_cast<size_t>(id)].size() <= 2) short_ones.push_back(id);
        int32_t pick = static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + valid) - logits.begin());
        if (rng() % 3 != 0 && !short_ones.empty()) pick = short_ones[rng() % short_ones.size()];
        if (pick == V - 1 || std::isinf(logits[static_cast<size_t>(pick)])) break;  // complete (the end id past `valid`)
        c.advance(pick);
        const std::string& b = (*vocab)[static_cast<size_t>(pick)];
        ASSERT_TRUE(with_schema ? schema_mirror.feed(std::string_view(b)) : plain_mirror.feed(b));
        text += b;
      }
    }
  }
  EXPECT_GE(masks, 30 * kTrials);
}

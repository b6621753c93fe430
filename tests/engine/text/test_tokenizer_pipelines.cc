// Tokenizers with any normalizer and pre-tokenizer, against Hugging Face's tokenizers itself (its
// Rust library through the npm package `tokenizers`; tests/scripts/make_tokenizer_pipeline_fixtures.mjs):
// five real tokenizer.json files kvpr did not load before (Mistral-Nemo's Tekken, DeepSeek-V3,
// GPT-4o, Claude, Yi) and synthetic pipelines over GPT-2's and Yi's vocabularies, each on a
// corpus of 418 strings: the ids without and with special tokens, and the decoded text. The
// fast paths (hand-written splitters for GPT-2's, Llama-3's and Qwen2's patterns) are checked
// against Oniguruma running the same patterns.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/base/error.h"
#include "engine/base/json.h"
#include "engine/base/rng.h"
#include "engine/model/demo_model.h"
#include "engine/text/pattern.h"
#include "engine/text/tokenizer.h"
#include "engine/text/unicode.h"
#include "tests/test_util.h"

using namespace kvpr;

namespace {

const std::string kModels = KVPR_TOKENIZER_MODELS;  // models.tar.xz, extracted by CMake

const json::Value& corpus() {
  static const json::Value c = json::parse_file(test::data_path("tokenizers/corpus.json"));
  return c;
}

const json::Value& expected(const std::string& name) {
  static const json::Value e = json::parse_file(test::data_path("tokenizers/expected.json"));
  const json::Value* t = e.find("tokenizers")->find(name);
  EXPECT_NE(t, nullptr) << name;
  return *t;
}

std::vector<int32_t> ids_of(const json::Value& v) {
  std::vector<int32_t> out;
  for (const auto& id : v.as_array()) out.push_back(static_cast<int32_t>(id.as_int()));
  return out;
}

// Every corpus string: the ids without special tokens, their decoding, and the first strings'
// ids with special tokens, as Hugging Face's tokenizers gives them.
void expect_matches(const Tokenizer& t, const std::string& name) {
  const json::Value& want = expected(name);
  const auto& texts = corpus().as_array();
  const auto& ids = want.find("ids")->as_array();
  const auto& decoded = want.find("decoded")->as_array();
  ASSERT_EQ(ids.size(), texts.size());
  int wrong = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string& text = texts[i].as_string();
    const std::vector<int32_t> w = ids_of(ids[i]);
    const std::vector<int32_t> got = t.encode(text, /*add_special=*/false);
    EXPECT_EQ(got, w) << name << ", text " << i << ": \"" << text << "\"";
    EXPECT_EQ(t.decode(w), decoded[i].as_string()) << name << ", text " << i << ": \"" << text << "\"";
    wrong += got != w;
  }
  const auto& with_special = want.find("with_special")->as_array();
  for (size_t i = 0; i < with_special.size(); ++i)
    EXPECT_EQ(t.encode(texts[i].as_string(), /*add_special=*/true), ids_of(with_special[i])) << name << ", text " << i;
  EXPECT_EQ(wrong, 0) << name;
}

// The same ids with the fast splitters and with Oniguruma running their patterns.
void expect_fast_equals_general(Tokenizer t, const std::string& name) {
  std::vector<std::vector<int32_t>> fast;
  for (const auto& s : corpus().as_array()) fast.push_back(t.encode(s.as_string(), false));
  t.set_fast_paths(false);
  size_t i = 0;
  for (const auto& s : corpus().as_array())
    EXPECT_EQ(t.encode(s.as_string(), false), fast[i++]) << name << ": \"" << s.as_string() << "\"";
}

void set_member(json::Value& obj, const std::string& key, json::Value v) {
  for (auto& [k, x] : obj.as_object())
    if (k == key) {
      x = std::move(v);
      return;
    }
  obj.as_object().emplace_back(key, std::move(v));
}

// A tokenizer.json: the base's model with a pipeline of pipelines.json spliced in.
std::string spliced(const std::string& name) {
  static const json::Value pipelines = json::parse_file(test::data_path("tokenizers/pipelines.json"));
  const json::Value& p = *pipelines.find(name);
  json::Value tj;
  if (p.find("base")->as_string() == "yi") {
    tj = json::parse_file(kModels + "/yi/tokenizer.json");
    json::Array added = tj.find("added_tokens")->as_array();
    for (const auto& a : p.find("added_tokens")->as_array()) added.push_back(a);
    set_member(tj, "added_tokens", json::Value(added));
  } else {  // GPT-2's vocab.json + merges.txt as a tokenizer.json BPE model
    json::Array merges;
    std::ifstream f(default_tokenizer_dir() + "/merges.txt");
    std::string line;
    while (std::getline(f, line))
      if (!line.empty() && line.rfind("#version", 0) != 0) merges.emplace_back(line);
    json::Object model{{"type", "BPE"}, {"vocab", json::parse_file(default_tokenizer_dir() + "/vocab.json")},
                       {"merges", json::Value(merges)}};
    tj = json::Value(json::Object{{"model", json::Value(model)}, {"added_tokens", *p.find("added_tokens")},
                                  {"decoder", json::parse(R"({"type": "ByteLevel"})")}});
  }
  set_member(tj, "normalizer", *p.find("normalizer"));
  set_member(tj, "pre_tokenizer", *p.find("pre_tokenizer"));
  set_member(tj, "post_processor", json::Value());
  if (!p.find("decoder")->is_null()) set_member(tj, "decoder", *p.find("decoder"));
  return tj.dump();
}

const char* kReal[] = {"mistral_nemo", "deepseek_v3", "gpt4o", "claude", "yi"};

}  // namespace

TEST(TokenizerPipelines, RealTokenizersMatchHuggingFace) {
  if (!unicode::available()) GTEST_SKIP() << "built without Oniguruma and utf8proc";
  ASSERT_GE(corpus().as_array().size(), 300u);
  for (const char* name : kReal) {
    SCOPED_TRACE(name);
    expect_matches(Tokenizer::load(kModels + "/" + name), name);
  }
}

// The tokenizer.json fixtures whose ids came from independent encoders, against Hugging Face too.
TEST(TokenizerPipelines, EarlierFixturesMatchHuggingFace) {
  const std::pair<const char*, const char*> earlier[] = {
      {"llama2-fixture", "llama-tokenizer"}, {"llama3-fixture", "llama3-tokenizer"}, {"qwen2-fixture", "qwen2-tokenizer"}};
  for (const auto& [name, dir] : earlier) {
    SCOPED_TRACE(name);
    test::TempDir d;  // tokenizer.json alone, as the reference read it (no tokenizer_config.json)
    std::filesystem::copy_file(test::data_path(std::string(dir) + "/tokenizer.json"), d.file("tokenizer.json"));
    expect_matches(Tokenizer::load(d.path()), name);
  }
}

TEST(TokenizerPipelines, SyntheticPipelinesMatchHuggingFace) {
  if (!unicode::available()) GTEST_SKIP() << "built without Oniguruma and utf8proc";
  const json::Value pipelines = json::parse_file(test::data_path("tokenizers/pipelines.json"));
  ASSERT_GE(pipelines.as_object().size(), 15u);
  for (const auto& [name, p] : pipelines.as_object()) {
    SCOPED_TRACE(name);
    test::TempDir dir;
    std::ofstream(dir.file("tokenizer.json")) << spliced(name);
    const Tokenizer t = Tokenizer::load(dir.path());
    expect_matches(t, name);
    expect_fast_equals_general(t, name);
  }
}

TEST(TokenizerPipelines, FastSplittersEqualOniguruma) {
  if (!unicode::available()) GTEST_SKIP() << "built without Oniguruma and utf8proc";
  expect_fast_equals_general(Tokenizer::from_files(default_tokenizer_dir() + "/vocab.json",
                                                   default_tokenizer_dir() + "/merges.txt"), "gpt2");
  expect_fast_equals_general(Tokenizer::load(test::data_path("llama3-tokenizer")), "llama3");
  expect_fast_equals_general(Tokenizer::load(test::data_path("qwen2-tokenizer")), "qwen2");
  // And on strings made to stress them: runs of whitespace before letters, digits, marks,
  // newlines and apostrophes in every order.
  const char* parts[] = {" ", "  ", "\n", "\r\n", "\t", "a", "Z", "é", "9", "123", "'s", "'LL", "!", "?!", "\u00a0", "日本",
                         "\u0301", "/", "\u3000", "x", "'\u017f", "'", "\u200d"};
  Rng rng(17);
  const Tokenizer llama3 = Tokenizer::load(test::data_path("llama3-tokenizer"));
  Tokenizer general = llama3;
  general.set_fast_paths(false);
  for (int trial = 0; trial < 500; ++trial) {
    std::string s;
    for (int k = 0; k < 12; ++k) s += parts[rng.next() % std::size(parts)];
    EXPECT_EQ(pretokenize_llama3(s).size() > 0, !s.empty());
    EXPECT_EQ(llama3.encode(s, false), general.encode(s, false)) << "\"" << s << "\"";
  }
}

// Added tokens as tokenizer.json flags them: lstrip takes the whitespace before, rstrip after,
// single_word only between non-word characters, normalized ones are looked for in normalized text.
TEST(TokenizerPipelines, AddedTokenFlags) {
  if (!unicode::available()) GTEST_SKIP() << "built without Oniguruma and utf8proc";
  test::TempDir dir;
  std::ofstream(dir.file("tokenizer.json")) << R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, " ": 2, "x": 3},
    "merges": []}, "normalizer": {"type": "Lowercase"}, "added_tokens": [
    {"id": 10, "content": "<m>", "lstrip": true, "rstrip": false, "single_word": false, "normalized": false, "special": true},
    {"id": 11, "content": "<r>", "lstrip": false, "rstrip": true, "single_word": false, "normalized": false, "special": true},
    {"id": 12, "content": "AB", "lstrip": false, "rstrip": false, "single_word": true, "normalized": true, "special": false}]})";
  const Tokenizer t = Tokenizer::load(dir.path());
  EXPECT_EQ(t.encode("a  <m>b", false), (std::vector<int32_t>{0, 10, 1}));
  EXPECT_EQ(t.encode("a<r>  b", false), (std::vector<int32_t>{0, 11, 1}));
  EXPECT_EQ(t.encode("x Ab x", false), (std::vector<int32_t>{3, 2, 12, 2, 3}));  // "ab" after lowercasing
  EXPECT_EQ(t.encode("xab", false), (std::vector<int32_t>{3, 0, 1}));           // not a single word
  // Ids out of range and text that is not UTF-8 are refused when the tokenizer loads.
  for (const char* bad : {R"({"id": -1, "content": "<x>"})", R"({"id": 2147483647, "content": "<x>"})",
                          "{\"id\": 20, \"content\": \"\xb8\xad\"}"}) {
    test::TempDir d;
    std::ofstream(d.file("tokenizer.json")) << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": [)"
                                            << bad << "]}";
    EXPECT_THROW(Tokenizer::load(d.path()), Error) << bad;
  }
}

// Byte tokens in a row decode to their text when it is UTF-8, else to one U+FFFD per byte, as
// Hugging Face's ByteFallback decoder does.
TEST(TokenizerPipelines, ByteFallbackDecoding) {
  if (!unicode::available()) GTEST_SKIP() << "built without Oniguruma and utf8proc";
  const Tokenizer yi = Tokenizer::load(kModels + "/yi");
  auto id = [&](const char* t) { return *yi.token_to_id(t); };
  EXPECT_EQ(yi.decode({id("<0xE4>"), id("<0xB8>"), id("<0xAD>")}), "\u4e2d");
  EXPECT_EQ(yi.decode({id("<0xE4>"), id("<0xB8>"), id("\u2581a")}), "\ufffd\ufffd a");
}

// A pattern is Oniguruma's: lookbehind, possessive quantifiers, Unicode properties; String
// patterns are literal. Catastrophic backtracking ends in an error, not a hang.
TEST(TokenizerPipelines, PatternsAndTheirBudget) {
  if (!unicode::available()) GTEST_SKIP() << "built without Oniguruma and utf8proc";
  auto spans = [](const Pattern& p, std::string_view s) {
    std::vector<std::string> out;
    for (const auto& m : p.find_matches(s)) out.push_back((m.match ? "+" : "-") + std::string(s.substr(m.begin, m.end - m.begin)));
    return out;
  };
  EXPECT_EQ(spans(Pattern::regex("(?<=a)b"), "abcb"), (std::vector<std::string>{"-a", "+b", "-cb"}));
  EXPECT_EQ(spans(Pattern::regex("\\p{Lu}++"), "aBCd"), (std::vector<std::string>{"-a", "+BC", "-d"}));
  EXPECT_EQ(spans(Pattern::literal("a.b"), "xa.bya+b"), (std::vector<std::string>{"-x", "+a.b", "-ya+b"}));
  EXPECT_EQ(spans(Pattern::regex("x*"), "ab"), (std::vector<std::string>{"+", "-a", "+", "-b", "+"}));
  EXPECT_EQ(spans(Pattern::regex("a"), ""), (std::vector<std::string>{"-"}));
  const Pattern bad = Pattern::regex("(\\w+\\s?)+$");
  const std::string text = std::string(5000, 'a') + " b c d e f g h i j k l m n o p q r s t u v w x y z !";
  const auto t0 = std::chrono::steady_clock::now();
  try {
    bad.find_matches(text);
    ADD_FAILURE() << "catastrophic backtracking did not hit the budget";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("failed on a text of"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));  // ended, not hung
  EXPECT_THROW(Pattern::regex("[a-"), Error);
}

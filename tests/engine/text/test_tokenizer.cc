// The tokenizer against GPT-2's reference encoder (fixture made by
// tests/scripts/make_tokenizer_fixtures.js from npm gpt-3-encoder@1.1.4) and against Llama-2's
// SentencePiece BPE as npm llama-tokenizer-js@1.2.2 encodes it
// (tests/scripts/make_llama_tokenizer_fixtures.mjs) and Llama-3's byte-level BPE as npm
// llama3-tokenizer-js@1.2.0 encodes it (tests/scripts/make_llama3_tokenizer_fixtures.mjs).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/model/demo_model.h"
#include "engine/base/error.h"
#include "engine/base/json.h"
#include "engine/base/rng.h"
#include "engine/text/tokenizer.h"
#include "engine/text/unicode.h"
#include "engine/base/utf8.h"
#include "tests/test_util.h"

using namespace kvpr;

namespace {
const Tokenizer& gpt2() {
  static Tokenizer t = Tokenizer::from_files(default_tokenizer_dir() + "/vocab.json",
                                             default_tokenizer_dir() + "/merges.txt");
  return t;
}
}  // namespace

TEST(Tokenizer, MatchesGpt2ReferenceOnCorpus) {
  json::Value corpus = json::parse_file(test::data_path("tokenizer_gpt2.json"));
  ASSERT_GE(corpus.as_array().size(), 200u);
  int checked = 0;
  for (const auto& e : corpus.as_array()) {
    const std::string& text = e.find("text")->as_string();
    std::vector<int32_t> want;
    for (const auto& id : e.find("ids")->as_array()) want.push_back(static_cast<int32_t>(id.as_int()));
    EXPECT_EQ(gpt2().encode_ordinary(text), want) << "text: \"" << text << "\"";
    // Decoding the reference ids gives the text back.
    EXPECT_EQ(gpt2().decode(want), text);
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(corpus.as_array().size()));
}

TEST(LlamaTokenizer, MatchesReferenceEncoderOnCorpus) {
  const std::string dir = test::data_path("llama-tokenizer");
  Tokenizer t = Tokenizer::load(dir);
  EXPECT_FALSE(t.is_byte_level());
  EXPECT_EQ(t.size(), 32000);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_TRUE(t.add_bos_token());
  json::Value corpus = json::parse_file(dir + "/cases.json");
  ASSERT_GE(corpus.as_array().size(), 250u);
  for (const auto& e : corpus.as_array()) {
    const std::string& text = e.find("text")->as_string();
    std::vector<int32_t> want;
    for (const auto& id : e.find("ids")->as_array()) want.push_back(static_cast<int32_t>(id.as_int()));
    EXPECT_EQ(t.encode_ordinary(text), want) << "text: \"" << text << "\"";
    std::vector<int32_t> with_bos = {1};
    with_bos.insert(with_bos.end(), want.begin(), want.end());
    EXPECT_EQ(t.encode(text), with_bos) << "text: \"" << text << "\"";
    // Decoding drops the "▁" the encoder put first (and BOS), giving the text back.
    EXPECT_EQ(t.decode(with_bos), text);
  }
}

TEST(LlamaTokenizer, SpecialTokensBytesAndStreamedText) {
  Tokenizer t = Tokenizer::load(test::data_path("llama-tokenizer"));
  // Written special tokens are recognised; each plain segment gets its "▁" (Llama-2's legacy
  // Prepend normalizer, as transformers' fast tokenizer encodes it).
  const std::vector<int32_t> hi = t.encode_ordinary("Hi");
  std::vector<int32_t> want = {1, 1};
  want.insert(want.end(), hi.begin(), hi.end());
  want.push_back(2);
  EXPECT_EQ(t.encode("<s>Hi</s>"), want);
  // A character outside the vocabulary becomes its UTF-8 bytes as <0xNN> tokens, and back.
  const std::vector<int32_t> ids = t.encode_ordinary("\xf0\x9f\xab\xa0");  // U+1FAE0
  ASSERT_EQ(ids.size(), 5u);                            // "▁" + four byte tokens
  EXPECT_EQ(t.id_to_token(ids[1]), "<0xF0>");
  EXPECT_EQ(t.token_bytes(ids[1]), "\xf0");
  // Streamed text keeps the space before each word (it continues the prompt); the bytes of a
  // split character come out once complete.
  StreamDecoder sd(t);
  std::string streamed;
  for (int32_t id : t.encode_ordinary("Paris \xf0\x9f\xab\xa0!")) streamed += sd.push(id);
  streamed += sd.finish();
  EXPECT_EQ(streamed, " Paris \xf0\x9f\xab\xa0!");
  EXPECT_EQ(t.token_bytes(1), "");  // BOS is skipped as special
}

TEST(LlamaTokenizer, TokenizerJsonItCannotRunIsRefused) {
  test::TempDir dir;
  auto error_for = [&](const std::string& body) {
    std::ofstream(dir.file("tokenizer.json")) << body;
    try {
      Tokenizer::load(dir.path());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_HAS(error_for(R"({"model": {"type": "Unigram", "vocab": []}})"), "only BPE models are supported");
  EXPECT_HAS(error_for(R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": {"type": "Sequence",
      "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(\\p{L}+"}, "behavior": "Isolated", "invert": false},
                        {"type": "ByteLevel", "use_regex": false}]}})"),
             "the pattern (\\p{L}+ does not compile: end pattern with unmatched parenthesis");
  EXPECT_HAS(error_for(R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": {"type": "Split",
      "pattern": {"Regex": "a"}, "behavior": "Sideways", "invert": false}})"), "unknown behavior Sideways");
  EXPECT_HAS(error_for(R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
                           "normalizer": {"type": "Precompiled", "precompiled_charsmap": ""}})"),
             "the Precompiled normalizer is not supported");
  EXPECT_HAS(error_for(R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
                           "pre_tokenizer": {"type": "UnicodeScripts"}})"),
             "the UnicodeScripts pre-tokenizer is not supported");
  EXPECT_HAS(error_for(R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "decoder": {"type": "WordPiece"}})"),
             "the WordPiece decoder is not supported");
  EXPECT_HAS(error_for(R"({"model": {"type": "BPE", "vocab": {}, "merges": [], "continuing_subword_prefix": "##"}})"),
             "a BPE model with a continuing_subword_prefix is not supported");
  EXPECT_HAS(error_for(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [3]},
                           "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581"}})"),
             "merge 0 is neither");
  // Metaspace with split and prepend_scheme "first", merges as pairs (tokenizers >= 0.20).
  std::ofstream(dir.file("tokenizer.json")) << R"({"model": {"type": "BPE", "vocab": {"\u2581": 0, "a": 1, "b": 2,
      "\u2581a": 3, "\u2581ab": 4, "ab": 5}, "merges": [["\u2581", "a"], ["\u2581a", "b"], ["a", "b"]]},
      "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": true}})";
  Tokenizer m = Tokenizer::load(dir.path());
  EXPECT_EQ(m.encode_ordinary("ab ab"), (std::vector<int32_t>{4, 4}));
  EXPECT_EQ(m.encode_ordinary("abab"), (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(m.decode({4, 4}), "ab ab");
}

// Llama-3's tokenizer.json (byte-level BPE after a Split by Llama-3's pattern, ignore_merges,
// BOS from the post-processor) against npm llama3-tokenizer-js@1.2.0's own encoder
// (tests/scripts/make_llama3_tokenizer_fixtures.mjs).
TEST(Llama3Tokenizer, MatchesReferenceEncoderOnCorpus) {
  const std::string dir = test::data_path("llama3-tokenizer");
  Tokenizer t = Tokenizer::load(dir);
  EXPECT_TRUE(t.is_byte_level());
  EXPECT_EQ(t.size(), 128256);
  EXPECT_EQ(t.bos_id(), 128000);  // <|begin_of_text|>, added by the TemplateProcessing post-processor
  EXPECT_EQ(t.eos_id(), 128001);  // <|end_of_text|>
  EXPECT_TRUE(t.add_bos_token());
  json::Value corpus = json::parse_file(dir + "/cases.json");
  ASSERT_GE(corpus.as_array().size(), 280u);
  for (const auto& e : corpus.as_array()) {
    const std::string& text = e.find("text")->as_string();
    std::vector<int32_t> want;
    for (const auto& id : e.find("ids")->as_array()) want.push_back(static_cast<int32_t>(id.as_int()));
    std::vector<int32_t> with_bos = {128000};
    with_bos.insert(with_bos.end(), want.begin(), want.end());
    EXPECT_EQ(t.encode(text), with_bos) << "text: \"" << text << "\"";
    // Byte-level: decoding gives the text back (special tokens written in it included).
    EXPECT_EQ(t.decode(with_bos, /*skip_special=*/false), "<|begin_of_text|>" + text) << "text: \"" << text << "\"";
  }
}

// Qwen2.5's tokenizer.json (NFC normalizer, Split by Qwen2's pattern: digits one by one, then
// ByteLevel; 22 added tokens, special or not; no BOS) against @lenml/tokenizers@3.7.2, a fork
// of transformers.js (tests/scripts/make_qwen2_tokenizer_fixtures.mjs): the ids, and the text
// they decode to (NFC's, where the input was not composed).
TEST(Qwen2Tokenizer, MatchesReferenceEncoderOnCorpus) {
  if (!unicode::available()) GTEST_SKIP() << "NFC needs utf8proc (built with KVPR_TEXT_LIBS=OFF)";
  const std::string dir = test::data_path("qwen2-tokenizer");
  Tokenizer t = Tokenizer::load(dir);
  EXPECT_TRUE(t.is_byte_level());
  EXPECT_EQ(t.size(), 151665);
  EXPECT_FALSE(t.add_bos_token());
  EXPECT_EQ(t.eos_id(), 151645);  // <|im_end|>: tokenizer_config.json's eos_token (Instruct)
  EXPECT_EQ(t.token_to_id("<|endoftext|>"), 151643);
  json::Value corpus = json::parse_file(dir + "/cases.json");
  ASSERT_GE(corpus.as_array().size(), 260u);
  int changed_by_nfc = 0;
  for (const auto& e : corpus.as_array()) {
    const std::string& text = e.find("text")->as_string();
    const std::string& decoded = e.find("decoded")->as_string();
    std::vector<int32_t> want;
    for (const auto& id : e.find("ids")->as_array()) want.push_back(static_cast<int32_t>(id.as_int()));
    EXPECT_EQ(t.encode(text), want) << "text: \"" << text << "\"";
    EXPECT_EQ(t.decode(want, /*skip_special=*/false), decoded) << "text: \"" << text << "\"";
    EXPECT_EQ(unicode::normalize(text, unicode::Form::NFC), decoded) << "text: \"" << text << "\"";
    changed_by_nfc += decoded != text;
  }
  EXPECT_GE(changed_by_nfc, 10);  // the corpus exercises the normalizer
}

// NFC on its own (utf8proc): decomposition, canonical order, composition (blocked and not),
// Hangul, singletons and exclusions.
TEST(Tokenizer, NfcComposesAsUnicodeSays) {
  if (!unicode::available()) GTEST_SKIP() << "built with KVPR_TEXT_LIBS=OFF";
  auto nfc = [](std::string_view s) { return unicode::normalize(s, unicode::Form::NFC); };
  EXPECT_EQ(nfc("plain ASCII, Latin-1 \xc3\xa9"), "plain ASCII, Latin-1 \xc3\xa9");
  EXPECT_EQ(nfc("e\xcc\x81"), "\xc3\xa9");                      // e + U+0301 -> U+00E9
  EXPECT_EQ(nfc("\xe1\xba\xbf"), "\xe1\xba\xbf");              // U+1EBF stays composed
  EXPECT_EQ(nfc("e\xcc\x82\xcc\x81"), "\xe1\xba\xbf");        // e + circumflex + acute -> U+1EBF
  EXPECT_EQ(nfc("a\xcc\x82\xcc\xa3"), "\xe1\xba\xad");        // dot below (220) sorts first: U+1EAD
  EXPECT_EQ(nfc("\xe2\x84\xab"), "\xc3\x85");                   // U+212B ANGSTROM SIGN -> U+00C5
  EXPECT_EQ(nfc("\xe0\xa5\x98"), "\xe0\xa4\x95\xe0\xa4\xbc");  // U+0958 is excluded: stays decomposed
  EXPECT_EQ(nfc("\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8"), "\xea\xb0\x81");  // jamo -> U+AC01
  EXPECT_EQ(nfc("\xea\xb0\x80\xe1\x86\xa8"), "\xea\xb0\x81");  // LV syllable + T
  EXPECT_EQ(nfc("\xcc\x81" "e"), "\xcc\x81" "e");                      // a mark with no starter before it
  EXPECT_EQ(nfc("\xea\xb0\x81"), "\xea\xb0\x81");
  // NFKC folds compatibility characters; NFD and NFKD decompose.
  EXPECT_EQ(unicode::normalize("\xef\xac\x81 x\xc2\xb2", unicode::Form::NFKC), "fi x2");  // U+FB01, U+00B2
  EXPECT_EQ(unicode::normalize("\xc3\xa9", unicode::Form::NFD), "e\xcc\x81");
  EXPECT_EQ(unicode::normalize("\xe2\x91\xa0", unicode::Form::NFKD), "1");  // U+2460
  EXPECT_EQ(unicode::lowercase("\xc4\xb0I\xce\xa3"), "i\xcc\x87i\xcf\x83");  // U+0130 -> i + U+0307; Σ -> σ
  // Random code points from the ranges where NFC acts (Latin, combining marks, Greek, Hebrew,
  // Devanagari, jamo, syllables): NFC's output is its own NFC.
  Rng rng(5);
  const std::pair<char32_t, char32_t> ranges[] = {{0x41, 0x7a}, {0xc0, 0x17f}, {0x300, 0x36f}, {0x386, 0x3ce},
                                                  {0x591, 0x5f4}, {0x900, 0x97f}, {0x1100, 0x11ff}, {0xac00, 0xd7a3},
                                                  {0x1e00, 0x1fff}, {0x2126, 0x212b}};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    const int n = 1 + static_cast<int>(rng.next() % 12);
    for (int i = 0; i < n; ++i) {
      const auto& [lo, hi] = ranges[rng.next() % std::size(ranges)];
      append_utf8(text, lo + static_cast<char32_t>(rng.next() % (hi - lo + 1)));
    }
    const std::string once = nfc(text);
    EXPECT_EQ(nfc(once), once) << "text: \"" << text << "\"";
  }
}

TEST(Llama3Tokenizer, IgnoreMergesStopIdsAndSpecialTokens) {
  test::TempDir dir;
  const std::string src = test::data_path("llama3-tokenizer");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(src + "/" + f, dir.file(f));
  // Llama-3-Instruct's generation_config.json: generation ends at any of its EOS ids.
  std::ofstream(dir.file("generation_config.json")) << R"({"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]})";
  Tokenizer t = Tokenizer::load(dir.path());
  EXPECT_TRUE(t.is_eos(128001));
  EXPECT_TRUE(t.is_eos(128008));
  EXPECT_TRUE(t.is_eos(128009));
  EXPECT_FALSE(t.is_eos(128000));
  EXPECT_FALSE(t.is_eos(13));
  EXPECT_EQ(t.extra_eos_ids(), (std::vector<int32_t>{128008, 128009}));
  EXPECT_EQ(t.token_to_id("<|eot_id|>"), 128009);
  EXPECT_TRUE(t.is_special(128009));
  EXPECT_EQ(t.decode({9906, 128009}), "Hello");  // special tokens skipped
  // ignore_merges: a pre-token that is in the vocabulary is that token, even where the merges
  // would not build it. A vocabulary of single bytes, one merge "a b", and "abc" as a token
  // that no merge makes: "abc" is one token with ignore_merges and "ab" + "c" without.
  const std::string small = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4},
      "merges": ["a b"], "ignore_merges": IGNORE}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
       "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]}})";
  for (bool ignore : {true, false}) {
    test::TempDir d;
    std::string body = small;
    body.replace(body.find("IGNORE"), 6, ignore ? "true" : "false");
    std::ofstream(d.file("tokenizer.json")) << body;
    Tokenizer m = Tokenizer::load(d.path());
    EXPECT_FALSE(m.add_bos_token());  // no post-processor, no add_bos_token
    EXPECT_EQ(m.encode("abc"), ignore ? std::vector<int32_t>({4}) : std::vector<int32_t>({3, 2}));
  }
}

TEST(Tokenizer, PretokenizerFollowsLlama3Pattern) {
  auto pieces = [](std::string_view s, int digits = 3) {
    std::vector<std::string> out;
    for (auto p : pretokenize_llama3(s, digits)) out.emplace_back(p);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces("I'M x'Ll"), (V{"I", "'M", " x", "'Ll"}));  // contractions in any case
  EXPECT_EQ(pieces("1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(pieces("1234", 1), (V{"1", "2", "3", "4"}));  // Qwen2's
  EXPECT_EQ(pieces("(hello)"), (V{"(hello", ")"}));       // one mark joins the word after it
  EXPECT_EQ(pieces("\thi"), (V{"\thi"}));
  EXPECT_EQ(pieces("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(pieces("  \n  x"), (V{"  \n", " ", " x"}));   // whitespace up to its last newline
  EXPECT_EQ(pieces("x...\n\ny"), (V{"x", "...\n\n", "y"}));
  EXPECT_EQ(pieces("a\r\nb"), (V{"a", "\r\n", "b"}));
  EXPECT_EQ(pieces("x \t!"), (V{"x", " ", "\t", "!"}));
  EXPECT_EQ(pieces("end  "), (V{"end", "  "}));
  EXPECT_TRUE(pieces("").empty());
}

// A pre-token can be as long as the request (here 256 KiB of one letter): BPE over it merges
// through a heap, O(n log n), and gives the text back.
TEST(Tokenizer, HugePretokensAndManySpecialTokensEncode) {
  const std::string big(1 << 18, 'a');
  const std::vector<int32_t> ids = gpt2().encode_ordinary(big);
  EXPECT_LT(ids.size(), big.size() / 2);
  EXPECT_EQ(gpt2().decode(ids), big);
  Tokenizer l3 = Tokenizer::load(test::data_path("llama3-tokenizer"));
  EXPECT_EQ(l3.decode(l3.encode(big)), big);
  // As many special tokens as fit in it: each of the 256 is searched for once per occurrence
  // of its own, not once per occurrence of any.
  std::string many;
  for (int i = 0; i < 20000; ++i) many += "<|eot_id|>x";
  const std::vector<int32_t> e = l3.encode(many, false);
  ASSERT_EQ(e.size(), 40000u);
  EXPECT_EQ(std::count(e.begin(), e.end(), 128009), 20000);
}

TEST(Tokenizer, PretokenizerFollowsGpt2Pattern) {
  auto pieces = [](std::string_view s) {
    std::vector<std::string> out;
    for (auto p : pretokenize(s)) out.emplace_back(p);
    return out;
  };
  EXPECT_EQ(pieces("Hello world"), (std::vector<std::string>{"Hello", " world"}));
  EXPECT_EQ(pieces("a  b"), (std::vector<std::string>{"a", " ", " b"}));
  EXPECT_EQ(pieces("I'm x's"), (std::vector<std::string>{"I", "'m", " x", "'s"}));
  EXPECT_EQ(pieces("x  "), (std::vector<std::string>{"x", "  "}));
  EXPECT_EQ(pieces("12ab!?"), (std::vector<std::string>{"12", "ab", "!?"}));
  EXPECT_TRUE(pieces("").empty());
}

TEST(Tokenizer, OptStyleSpecialTokensAndBos) {
  test::TempDir dir;
  // OPT: vocab with <s>=0 <pad>=1 </s>=2 <unk>=3 and add_bos_token prepending </s>.
  std::string vocab = R"({"<s>":0,"<pad>":1,"</s>":2,"<unk>":3,"H":4,"i":5,"Hi":6,"Ġ":7,"Ġthere":8,"t":9,"h":10,"e":11,"r":12})";
  std::ofstream(dir.file("vocab.json")) << vocab;
  std::ofstream(dir.file("merges.txt")) << "#version: 0.2\nH i\nĠ t\nĠt h\nĠth e\nĠthe r\nĠther e\n";
  std::ofstream(dir.file("tokenizer_config.json"))
      << R"({"add_bos_token": true, "bos_token": {"content": "</s>"}, "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"})";
  std::ofstream(dir.file("special_tokens_map.json")) << R"({"bos_token": "</s>", "eos_token": "</s>"})";
  Tokenizer t = Tokenizer::load(dir.path());
  EXPECT_EQ(t.bos_id(), 2);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.pad_id(), 1);
  EXPECT_EQ(t.encode("Hi there"), (std::vector<int32_t>{2, 6, 8}));
  EXPECT_EQ(t.encode("Hi</s>Hi"), (std::vector<int32_t>{2, 6, 2, 6}));  // special token in text
  EXPECT_EQ(t.decode({2, 6, 8, 2}), "Hi there");
  EXPECT_EQ(t.decode({2, 6, 8}, /*skip_special=*/false), "</s>Hi there");
  EXPECT_TRUE(t.is_special(2));
  EXPECT_FALSE(t.is_special(6));
  EXPECT_EQ(t.size(), 13);
}

TEST(Tokenizer, AddedTokensFromTokenizerJsonExtendTheVocabulary) {
  test::TempDir dir;
  std::ofstream(dir.file("vocab.json")) << R"({"a":0,"b":1})";
  std::ofstream(dir.file("merges.txt")) << "#version: 0.2\n";
  std::ofstream(dir.file("tokenizer.json"))
      << R"({"added_tokens":[{"id":2,"content":"<|im_end|>","special":true},{"id":3,"content":"<x>","special":false}]})";
  Tokenizer t = Tokenizer::load(dir.path());
  EXPECT_EQ(t.size(), 4);
  EXPECT_EQ(t.encode("a<|im_end|>b<x>"), (std::vector<int32_t>{0, 2, 1, 3}));
  EXPECT_EQ(t.decode({0, 2, 1, 3}), "ab<x>");
}

TEST(Tokenizer, StreamingNeverSplitsACharacter) {
  const Tokenizer& t = gpt2();
  for (std::string text : {"😀 emoji and 日本語 text", "naïve café", "👨‍👩‍👧‍👦!", "plain ascii"}) {
    std::vector<int32_t> ids = t.encode_ordinary(text);
    StreamDecoder dec(t);
    std::string joined;
    for (int32_t id : ids) {
      std::string piece = dec.push(id);
      EXPECT_EQ(sanitize_utf8(piece), piece) << "piece is not valid UTF-8";
      joined += piece;
    }
    joined += dec.finish();
    EXPECT_EQ(joined, text);
  }
}

TEST(Tokenizer, PartialUtf8BecomesReplacementCharacter) {
  EXPECT_EQ(sanitize_utf8("a\xe6\x97"), "a\xef\xbf\xbd");
  EXPECT_EQ(sanitize_utf8("\xff" "b"), "\xef\xbf\xbd" "b");
  EXPECT_EQ(sanitize_utf8("\xe6\x97\xa5"), "\xe6\x97\xa5");
  EXPECT_EQ(utf8_complete_prefix("ab\xe6\x97"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xe6\x97\xa5"), 5u);
  // One token of GPT-2 can be half of a character: 日 is split into byte tokens.
  const Tokenizer& t = gpt2();
  std::vector<int32_t> ids = t.encode_ordinary("日");
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(t.decode({ids[0]}), "\xef\xbf\xbd");
}

TEST(Tokenizer, MissingFilesGiveClearErrors) {
  test::TempDir dir;
  try {
    Tokenizer::load(dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab.json and merges.txt, or tokenizer.json, are required"), std::string::npos);
  }
  std::ofstream(dir.file("vocab.json")) << "{\"a\": 0,";
  std::ofstream(dir.file("merges.txt")) << "#version: 0.2\n";
  try {
    Tokenizer::load(dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab.json: invalid JSON"), std::string::npos) << e.what();
  }
}

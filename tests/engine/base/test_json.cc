#include <gtest/gtest.h>

#include "engine/base/error.h"
#include "engine/base/json.h"

using namespace kvpr;

TEST(Json, ParsesAllKinds) {
  json::Value v = json::parse(R"({"a": 1, "b": -2.5e3, "c": "x\ny\u00e9\ud83d\ude00", "d": [true, false, null], "e": {}})");
  EXPECT_EQ(v.find("a")->as_int(), 1);
  EXPECT_DOUBLE_EQ(v.find("b")->as_double(), -2500.0);
  EXPECT_EQ(v.find("c")->as_string(), "x\ny\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_TRUE(v.find("d")->as_array()[0].as_bool());
  EXPECT_TRUE(v.find("d")->as_array()[2].is_null());
  EXPECT_TRUE(v.find("e")->as_object().empty());
  EXPECT_EQ(v.find("zz"), nullptr);
}

TEST(Json, RoundTripsThroughDump) {
  std::string text = R"({"k":[1,2.5,"q\"\\\u0001"],"n":null,"t":true})";
  json::Value v = json::parse(text);
  EXPECT_EQ(json::parse(v.dump()).dump(), v.dump());
  EXPECT_EQ(v.dump(), text);
}

TEST(Json, ErrorsSayWhereAndWhat) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "tru", "\"abc", "1 2", "{\"a\":01x}", "[\"\x01\"]"}) {
    try {
      json::parse(bad);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("invalid JSON"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("line"), std::string::npos) << e.what();
    }
  }
}

TEST(Json, TypeErrorsNameTheExpectedType) {
  json::Value v = json::parse(R"({"a": "s"})");
  try {
    v.find("a")->as_int();
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "expected an integer, found a string");
  }
}

TEST(Json, RejectsDeepNesting) {
  std::string deep(1000, '[');
  EXPECT_THROW(json::parse(deep), Error);
}

// What Hugging Face's `tojson` (Python's json.dumps with ensure_ascii=False) writes; the
// expected texts are CPython 3.11's.
TEST(Json, DumpsAsPythonsJsonDumps) {
  const json::Value floats = json::parse(
      "[1.0, 0.5, 1e-05, 1e16, 1e15, 0.0001, 1.234e-05, 1.5e300, -0.0, 0.1, 123456.789, 5e-324, "
      "1.7976931348623157e308, 100.0, 0.00009999, 9999999999999998.0, -2.5e-7, 3, -7, NaN, Infinity, -Infinity]");
  EXPECT_EQ(floats.dump_python(),
            "[1.0, 0.5, 1e-05, 1e+16, 1000000000000000.0, 0.0001, 1.234e-05, 1.5e+300, -0.0, 0.1, 123456.789, 5e-324, "
            "1.7976931348623157e+308, 100.0, 9.999e-05, 9999999999999998.0, -2.5e-07, 3, -7, NaN, Infinity, -Infinity]");
  const json::Value o = json::parse("{\"b\": 1, \"a\": [{}, [], \"\\u00e9\\u2028\\u007f\\u001f\\\"\\\\\"], \"c\": null, \"d\": true}");
  EXPECT_EQ(o.dump_python(), "{\"b\": 1, \"a\": [{}, [], \"\xc3\xa9\xe2\x80\xa8\x7f\\u001f\\\"\\\\\"], \"c\": null, \"d\": true}");
  // json.loads keeps a repeated key at its first place with its last value.
  EXPECT_EQ(json::parse(R"({"a": 1, "b": 2, "a": 3})").dump_python(), R"({"a": 3, "b": 2})");
}

// A peer's JSON (an HTTP body): what parse() tolerates in model files is an error here, and a
// repeated key leaves what json.loads would.
TEST(Json, StrictParseRefusesWhatAPeerMustNotSend) {
  for (std::string_view bad : {std::string_view("{\"p\": \"\xff\xfe\"}"), std::string_view("\"\xc3\""),
                               std::string_view("\"\xed\xa0\x80\""), std::string_view(R"("\ud800")"),
                               std::string_view(R"("\udc00\ud800")"), std::string_view(R"("\ud800\u0041")"),
                               std::string_view("[NaN]"), std::string_view("[-Infinity]"), std::string_view("Infinity")}) {
    EXPECT_THROW(json::parse_strict(bad), Error) << bad;
  }
  EXPECT_NO_THROW(json::parse(R"("\ud800")"));  // model files: U+FFFD
  EXPECT_EQ(json::parse_strict(R"("\ud83d\ude00 \u00e9 )" "\xe2\x82\xac\"").as_string(),
            "\xf0\x9f\x98\x80 \xc3\xa9 \xe2\x82\xac");
  const json::Value o = json::parse_strict(R"({"a": 1, "b": 2, "a": {"x": 3}, "c": [], "b": 4, "a": 5})");
  EXPECT_EQ(o.dump(), R"({"a":5,"b":4,"c":[]})");
  EXPECT_THROW(json::parse_strict(std::string(300, '[') + std::string(300, ']')), Error);
  EXPECT_NO_THROW(json::parse_strict(std::string(200, '[') + std::string(200, ']')));
  for (std::string_view bad : {"[010]", "[-01]", "{\"n\": 00}"}) EXPECT_THROW(json::parse_strict(bad), Error) << bad;
  EXPECT_EQ(json::parse_strict("[0, -0, 0.5, 10, 1e3]").dump(), "[0,0,0.5,10,1000]");
}

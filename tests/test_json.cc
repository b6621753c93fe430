#include <gtest/gtest.h>

#include "engine/error.h"
#include "engine/json.h"

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

// The json_object mode (OpenAI's response_format {"type": "json_object"}): a byte-level
// recognizer of JSON text (RFC 8259); token_constraint.h masks a vocabulary with it.
//
// The recognizer reads one JSON value a byte at a time (an object, when asked for one), with
// strings checked as UTF-8 and escapes as JSON's, and refuses a byte that cannot continue it.
// Whitespace between tokens is compact by default (nothing, a space, or a newline and up to 20
// bytes of indentation: json_lex::Whitespace), or any whitespace up to `max_whitespace` bytes
// in a row when permissive, so that a model cannot loop on blank lines; nesting is limited to
// `max_depth`. After the value only that whitespace may follow, and the end-of-sequence tokens
// become allowed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "engine/constrain/json_lex.h"

namespace kvpr {

struct JsonConstraintOptions {
  bool object_only = true;  // the value must be an object (json_object)
  bool permissive_whitespace = false;  // any whitespace between tokens, not only the compact forms
  int max_whitespace = 48;  // permissive: whitespace bytes in a row between tokens of the JSON
  int max_depth = 64;       // nested objects and arrays (at most 64)
  json_lex::Whitespace whitespace() const {
    return {permissive_whitespace, static_cast<uint8_t>(max_whitespace < 0 ? 0 : max_whitespace > 255 ? 255 : max_whitespace)};
  }
};

class JsonRecognizer {
 public:
  using Options = JsonConstraintOptions;
  explicit JsonRecognizer(const Options& o = {});

  // Reads one byte; false (and the recognizer is then unusable) when it cannot continue the text.
  bool feed(uint8_t c);
  bool feed(std::string_view bytes);
  // A whole value has been read (a number at the top level counts once it is well formed).
  bool complete() const;

  // The state, as bytes: equal states accept the same continuations.
  std::string_view key() const { return {reinterpret_cast<const char*>(&s_), sizeof s_}; }
  // Inside a string, between characters: how many more characters it may take (INT64_MAX: no
  // bound); -1 elsewhere. A string-local token (no quote, backslash or control byte; UTF-8 from a
  // character's start, possibly ending inside one) then fits exactly when it begins no more
  // characters than that (token_constraint.h's VocabularyIndex).
  int64_t plain_string_room() const;

 private:
  struct State {
    uint64_t stack = 0;  // bit d set: the container at depth d is an object
    uint8_t depth = 0;
    uint8_t mode = 0;
    uint8_t sub = 0;  // string: escape state; number: where in it; literal: next char
    uint8_t aux = 0;  // string: UTF-8 continuation bytes due; literal: which
    uint8_t ws = 0;   // whitespace bytes in a row
    uint8_t key = 0;  // the string being read is an object's key
    uint8_t pad[2] = {0, 0};
  };
  bool value_start(uint8_t c);
  void end_value();
  bool close(bool object);

  State s_;
  json_lex::Whitespace ws_;
  uint8_t max_depth_;
  bool object_only_;
};

}  // namespace kvpr

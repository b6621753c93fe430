// The Jinja lexer: a template's source as tokens (text, tag delimiters, names, literals,
// operators), each with its line.
//
// Lexing follows jinja2's with trim_blocks and lstrip_blocks (as transformers configures it):
// the source's newlines are normalised as str.splitlines() then "\n".join() does (so one
// trailing newline goes); "{%-"/"-%}" (and {{ }}, {# #}) strip all whitespace on their side;
// a block or comment tag that only whitespace precedes on its line takes that whitespace away
// (not with "{%+"); the newline right after a block or comment tag goes (not with "+%}").
#pragma once

#include <string>
#include <vector>

#include "jinja/value.h"

namespace kvpr::jinja {

struct Token {
  enum class Kind { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };
  Kind kind;
  std::string text;  // Text, Name, String (decoded), Op
  Value number;
  int line = 0;
};

// The tokens of `source`, ending with an End token; throws kvpr::Error "line N: ..." for what it
// cannot read.
std::vector<Token> lex(const std::string& source);

}  // namespace kvpr::jinja

// What parser.cc makes of a template and renderer.cc runs: expressions and statements,
// each with the line it came from (errors name it).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace kvpr::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,   // value
    Name,      // name
    ListLiteral,  // items; negated: a tuple
    DictLiteral,  // items: key, value, key, value, ...
    Attr,      // a.name
    Item,      // a[b]
    Slice,     // a[items[0]:items[1]:items[2]] (null parts omitted)
    Call,      // a(items..., kwargs...)
    Filter,    // a | name(items..., kwargs...)
    Test,      // a is [not] name(items...): negated
    Not,       // not a
    Neg,       // -a
    Pos,       // +a
    Binary,    // a op b: + - * / // % ** ~
    And,       // a and b
    Or,        // a or b
    Compare,   // a ops[0] items[0] ops[1] items[1] ...: == != < <= > >= in notin
    Cond,      // a if b else c (c null: undefined)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;  // Name, Attr, Filter, Test, Binary's operator
  bool negated = false;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // Compare
  ExprPtr a, b, c;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    Root,         // body
    Text,         // text
    Output,       // {{ expr }}
    If,           // branches (a null condition: else)
    For,          // targets in expr [if cond]: body, else_body
    Set,          // targets (or target.attr) = expr
    SetBlock,     // {% set target %}body{% endset %} (filters applied to the captured text)
    Macro,        // name(params): body
    CallBlock,    // {% call [(params)] expr %}body{% endcall %}: caller() renders body
    FilterBlock,  // {% filter f %}body{% endfilter %} (filters in `filters`)
    Break,
    Continue,
  };
  Kind kind;
  int line = 0;
  std::string text;                  // Text; Set/SetBlock/Macro: the name
  std::string attr;                  // Set: ns.attr
  std::vector<std::string> targets;  // For, Set (several: unpacking)
  ExprPtr expr, cond;
  Body body, else_body;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro, CallBlock: name and default (or null)
  std::vector<ExprPtr> filters;                          // SetBlock, FilterBlock: Filter exprs on a null a
};

}  // namespace kvpr::jinja

// A Jinja interpreter for the subset Hugging Face chat templates use, rendering as Python's
// jinja2 does when transformers sets it up (ImmutableSandboxedEnvironment with trim_blocks,
// lstrip_blocks and loop controls; its tojson, raise_exception and strftime_now):
//   statements  for (loop.*, else, a filter after `if`, break/continue), if/elif/else, set (also
//               namespace attributes and blocks), macro and call/caller, filter blocks, raw,
//               generation (transformers' tag: renders its body), comments, whitespace control
//   expressions literals, lists, tuples, dicts, attribute and item access, slices, calls with
//               keywords, filters, `is` tests, `in`/`not in`, `~`, arithmetic, comparisons (also
//               chained), and/or/not, `x if c else y`
//   filters, tests, methods and globals: the ones templates call (docs/models.md lists them)
// What it does not know (an `include`, an unknown filter or test) is refused when the template
// is parsed, with the line; what fails while rendering (raise_exception, an undefined
// attribute's use) is an error naming the line, never a silently different prompt. A template is
// trusted input from the model directory, but a parse has a depth limit and a render a step and
// an output budget, so that no template hangs the daemon.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "jinja/value.h"

namespace kvpr::jinja {

struct Limits {
  int max_depth = 256;               // nesting of statements and expressions in the source
  int max_call_depth = 64;           // macros calling macros (and recursion)
  int64_t max_steps = 20'000'000;    // expressions evaluated and statements run in one render
  size_t max_output = 32u << 20;     // bytes one render writes
};

struct Node;

class Template {
 public:
  // Parses `source`; throws kvpr::Error "line N: ..." for what it cannot parse or does not know.
  explicit Template(const std::string& source, Limits limits = {});
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with `context` (a dict: the template's variables); throws kvpr::Error "line N: ..."
  // (raise_exception's message as given).
  std::string render(const Value& context) const;

 private:
  std::unique_ptr<Node> root_;
  Limits limits_;
};

}  // namespace kvpr::jinja

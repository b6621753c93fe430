// The engine's settings as every front end takes them: `kvpr generate`, kvprd's flags and config
// file, kvpr-worker (kvprd passes them on as flags) and kvpr-bench. One table of names, help,
// and how each value sets GeneratorOptions, and one validation of the whole; a front end adds
// only its own options (kvprd's HTTP limits, the CLI's prompt and sampling flags).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/base/option_value.h"
#include "engine/decode/generator_options.h"

namespace kvpr {

struct EngineOptions {
  GeneratorOptions generator;
  bool weights_on_host = false;  // --weights host: layer weights streamed from pinned host memory
  std::string profile;           // --profile FILE: a saved link profile (kvpr profile --save)
  bool verify_weights = false;   // --verify-weights on: ModelLoadOptions::verify_weights
  // --kv-mode was given; else generator.kv.mode is resident, which kvprd's workers turn into
  // auto on a GPU.
  bool kv_mode_given = false;
};

struct EngineOption {
  const char* name;  // as a flag without "--", as a config file key
  std::string help;  // the default in [brackets]
  bool is_switch;    // on or off (the CLI also takes the bare flag for on)
  // Sets the value (throws kvpr::Error "name: expected ..., got 'v'").
  std::function<void(EngineOptions&, const std::string&)> set;
  // The value as `set` takes it.
  std::function<std::string(const EngineOptions&)> get;
};

const std::vector<EngineOption>& engine_options();
const EngineOption* find_engine_option(std::string_view name);  // nullptr when not one

// "--name", "value" for every option whose value is not its default (kvprd -> kvpr-worker).
std::vector<std::string> engine_option_args(const EngineOptions& o);

// The checks across options (split needs kvpr, CUDA graphs need resident KV and device weights,
// the ranges): kvpr::Error with one line naming the options, as the user spells them.
void validate(const EngineOptions& o);

}  // namespace kvpr

// kvpr-bench schemas --file SAMPLE.jsonl [--tokenizer DIR] [--json FILE]
//
// Real-world JSON Schemas against the schema compiler and recognizer (engine/constrain): a JSONL
// file of {subset, id, schema, tests: [{valid, data}]} lines (JSONSchemaBench's schemas with
// MaskBench's instances, as the sample beside the repository holds them). Per schema: compiled or
// refused (and why: the keyword, or the first words of the error), the compile time, and whether
// every instance is judged right: a valid one taken whole (its text as Python's json.dumps writes
// it, the style the masks allow), an invalid one refused somewhere. A token is allowed exactly
// when its bytes continue the recognizer (JsonTokenConstraint::mask), so an instance taken byte by
// byte is taken token by token with any tokenizer's tokens. With --tokenizer, also the first
// mask of each compiled schema over that vocabulary (fresh: no state cached), the latency a
// request sees before its first constrained token, and MaskBench's measurement: every valid
// instance written token by token (the tokenizer's encoding of its text), each token's mask timed
// (one mask table per schema, shared by its instances as a worker shares it between requests)
// and the token checked to be allowed by it. Schemas whose worst case passes
// SchemaLimits::kMaxThreads alternatives side by side are counted (what the model writes under
// them may be narrowed).
#include "bench/commands.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <map>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "engine/base/error.h"
#include "engine/base/json.h"
#include "engine/constrain/json_schema.h"
#include "engine/constrain/token_constraint.h"
#include "engine/text/tokenizer.h"

namespace kvpr::bench {

namespace {

// What a refusal says, grouped: "keyword X" for a keyword not enforced, else the message's words
// after its path, cut before any quoted name.
std::string refusal_kind(const std::string& what) {
  const std::string kw = "the keyword '";
  if (size_t k = what.find(kw); k != std::string::npos) {
    const size_t e = what.find('\'', k + kw.size());
    return "keyword " + what.substr(k + kw.size(), e - k - kw.size());
  }
  std::string s = what;
  if (size_t c = s.find(": "); c != std::string::npos && s[0] == '$') s = s.substr(c + 2);
  if (size_t q = s.find_first_of("'\"0123456789"); q != std::string::npos) s = s.substr(0, q);
  while (!s.empty() && (s.back() == ' ' || s.back() == ',' || s.back() == '(')) s.pop_back();
  return s.size() > 70 ? s.substr(0, 70) : s;
}

struct SubsetCount {
  int schemas = 0, compiled = 0, with_tests = 0, all_right = 0, valid = 0, valid_taken = 0, invalid = 0,
      invalid_refused = 0;
};

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

}  // namespace

int cmd_schemas(const Args& args) {
  Options o(args, {"--file", "--tokenizer", "--json"});
  const std::string file = o.get("--file", "");
  KVPR_CHECK(!file.empty(), "kvpr-bench schemas: --file SAMPLE.jsonl is required");
  std::ifstream in(file);
  KVPR_CHECK(in, "kvpr-bench schemas: cannot read ", file);
  std::shared_ptr<JsonTokenConstraint::Vocabulary> vocab;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<JsonMaskTable> facts;
  const std::string tok_dir = o.get("--tokenizer", "");
  if (!tok_dir.empty()) {
    tok = std::make_unique<Tokenizer>(Tokenizer::load(tok_dir));
    vocab = std::make_shared<JsonTokenConstraint::Vocabulary>();
    for (int32_t t = 0; t < tok->size(); ++t) vocab->push_back(tok->token_bytes(t, true));
    facts = std::make_unique<JsonMaskTable>(vocab);
  }
  std::map<std::string, SubsetCount> subsets;
  std::map<std::string, int> refusals;
  std::vector<double> compile_s, first_mask_s, mask_s;
  int64_t tokens_refused = 0;  // tokens of valid instances that their masks did not allow
  int narrowed = 0;  // compiled schemas whose worst case passes SchemaLimits::kMaxThreads
  json::Array rows;
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ++lines;
    const json::Value doc = json::parse(line);
    const std::string subset = doc.find("subset") ? doc.find("subset")->as_string() : "all";
    const std::string id = doc.find("id") ? doc.find("id")->as_string() : std::to_string(lines);
    SubsetCount& c = subsets[subset];
    ++c.schemas;
    json::Value row(json::Object{});
    row.set("id", id);
    std::shared_ptr<const JsonSchema> schema;
    const auto t0 = Clock::now();
    try {
      schema = std::make_shared<const JsonSchema>(JsonSchema::compile(*doc.find("schema")));
    } catch (const Error& e) {
      const std::string kind = refusal_kind(e.what());
      ++refusals[kind];
      row.set("refused", kind);
      row.set("error", std::string(e.what()).substr(0, 300));
    }
    if (schema) {
      compile_s.push_back(seconds_since(t0));
      ++c.compiled;
      row.set("compile_ms", compile_s.back() * 1e3);
      if (schema->ambiguity() > SchemaLimits::kMaxThreads) {  // what the model writes may be narrowed
        ++narrowed;
        row.set("ambiguity", schema->ambiguity());
      }
      const json::Value* tests = doc.find("tests");
      int right = 0, total = 0;
      json::Array wrong;
      if (tests && tests->is_array())
        for (const json::Value& t : tests->as_array()) {
          const bool valid = t.find("valid")->as_bool();
          const std::string text = t.find("data")->dump_python();
          SchemaRecognizer r(schema.get());
          const bool taken = r.feed(text) && r.complete();
          ++total;
          (valid ? c.valid : c.invalid)++;
          if (valid && taken) ++c.valid_taken;
          if (!valid && !taken) ++c.invalid_refused;
          if (taken == valid) ++right;
          else if (wrong.empty()) {
            std::string what = "invalid taken: " + text.substr(0, 100);
            if (valid) {  // where: the first byte refused
              SchemaRecognizer by_byte(schema.get());
              size_t at = 0;
              while (at < text.size() && by_byte.feed(static_cast<uint8_t>(text[at]))) ++at;
              const size_t from = at > 60 ? at - 60 : 0;
              what = "valid refused at byte " + std::to_string(at) + ": ..." + text.substr(from, at - from) + " <here> " +
                     text.substr(at, 20);
            }
            wrong.push_back(json::Value(what));
          }
        }
      if (total > 0) {
        ++c.with_tests;
        if (right == total) ++c.all_right;
        row.set("instances", total);
        row.set("instances_right", right);
        // (what was judged wrong is printed, not kept: the benchmark's instances stay out of results)
        if (!wrong.empty()) std::printf("judged wrong: %s: %s\n", id.c_str(), wrong[0].as_string().c_str());
      }
      if (vocab) {
        const int32_t V = static_cast<int32_t>(vocab->size());
        auto table = facts->sibling(schema, JsonConstraintOptions{});  // the vocabulary's index as a worker keeps it
        JsonTokenConstraint k(table);
        std::vector<float> logits(vocab->size(), 0.f);
        const auto m0 = Clock::now();
        const int64_t allowed = k.mask(logits.data(), V, {});
        first_mask_s.push_back(seconds_since(m0));
        row.set("first_mask_ms", first_mask_s.back() * 1e3);
        row.set("first_mask_allowed", allowed);
        int64_t masks = 0, refused_here = 0;
        if (tests && tests->is_array())
          for (const json::Value& t : tests->as_array()) {
            if (!t.find("valid")->as_bool()) continue;
            JsonTokenConstraint w(table);
            for (int32_t tid : tok->encode(t.find("data")->dump_python(), false)) {
              std::fill(logits.begin(), logits.end(), 0.f);
              const auto s0 = Clock::now();
              w.mask(logits.data(), V, {});
              mask_s.push_back(seconds_since(s0));
              ++masks;
              if (logits[static_cast<size_t>(tid)] == -std::numeric_limits<float>::infinity()) {
                ++refused_here;
                break;  // (the recognizer cannot take it either)
              }
              w.advance(tid);
            }
          }
        row.set("masks", masks);
        if (masks > 0) {
          const std::vector<double> mine(mask_s.end() - masks, mask_s.end());
          row.set("mask_us_p50", quantile(mine, 0.5) * 1e6);
          row.set("mask_us_max", quantile(mine, 1.0) * 1e6);
          row.set("mask_ms_total", [&] {
            double sum = 0;
            for (double x : mine) sum += x;
            return sum * 1e3;
          }());
        }
        if (refused_here > 0) row.set("tokens_refused", refused_here);
        tokens_refused += refused_here;
      }
    }
    rows.push_back(std::move(row));
  }
  KVPR_CHECK(lines > 0, "kvpr-bench schemas: ", file, " holds no schema");

  std::printf("%-16s %8s %9s %11s %11s %13s %15s\n", "subset", "schemas", "compiled", "with tests", "all right",
              "valid taken", "invalid refused");
  SubsetCount all;
  json::Object per_subset;
  auto pct = [](int a, int b) { return b > 0 ? 100.0 * a / b : 0.0; };
  auto print = [&](const std::string& name, const SubsetCount& c) {
    std::printf("%-16s %8d %8.1f%% %11d %10.1f%% %6d/%-6d %7d/%-7d\n", name.c_str(), c.schemas, pct(c.compiled, c.schemas),
                c.with_tests, pct(c.all_right, c.with_tests), c.valid_taken, c.valid, c.invalid_refused, c.invalid);
  };
  for (const auto& [name, c] : subsets) {
    print(name, c);
    all.schemas += c.schemas, all.compiled += c.compiled, all.with_tests += c.with_tests, all.all_right += c.all_right;
    all.valid += c.valid, all.valid_taken += c.valid_taken, all.invalid += c.invalid;
    all.invalid_refused += c.invalid_refused;
    json::Value v(json::Object{});
    v.set("schemas", c.schemas);
    v.set("compiled", c.compiled);
    v.set("with_tests", c.with_tests);
    v.set("all_right", c.all_right);
    per_subset.emplace_back(name, std::move(v));
  }
  print("all", all);
  std::printf("compile: p50 %.3f ms, p99 %.3f ms, max %.3f ms\n", quantile(compile_s, 0.5) * 1e3,
              quantile(compile_s, 0.99) * 1e3, quantile(compile_s, 1.0) * 1e3);
  std::vector<double> ttfm(first_mask_s.size());  // a request's wait: its schema compiled, then its first mask
  for (size_t i = 0; i < ttfm.size(); ++i) ttfm[i] = compile_s[i] + first_mask_s[i];
  if (vocab) {
    std::printf("first mask over %zu tokens: p50 %.3f ms, p99 %.3f ms, max %.3f ms\n", vocab->size(),
                quantile(first_mask_s, 0.5) * 1e3, quantile(first_mask_s, 0.99) * 1e3, quantile(first_mask_s, 1.0) * 1e3);
    std::printf("time to first mask (compile + mask): p50 %.3f ms, p99 %.3f ms\n", quantile(ttfm, 0.5) * 1e3,
                quantile(ttfm, 0.99) * 1e3);
    std::printf("valid instances token by token: %zu masks, p50 %.1f us, p99 %.1f us, max %.1f us; tokens refused %lld\n",
                mask_s.size(), quantile(mask_s, 0.5) * 1e6, quantile(mask_s, 0.99) * 1e6, quantile(mask_s, 1.0) * 1e6,
                static_cast<long long>(tokens_refused));
  }
  std::vector<std::pair<int, std::string>> why;
  for (const auto& [k, n] : refusals) why.emplace_back(n, k);
  std::sort(why.rbegin(), why.rend());
  std::printf("compiled with a worst case past %lld alternatives side by side (may narrow): %d\n",
              static_cast<long long>(SchemaLimits::kMaxThreads), narrowed);
  std::printf("refused (%d):\n", all.schemas - all.compiled);
  json::Object refused;
  for (const auto& [n, k] : why) {
    std::printf("  %4d  %s\n", n, k.c_str());
    refused.emplace_back(k, json::Value(n));
  }

  json::Value result(json::Object{});
  result.set("benchmark", "json-schemas");
  result.set("file", file);
  result.set("schemas", all.schemas);
  result.set("compiled", all.compiled);
  result.set("compiled_share", pct(all.compiled, all.schemas) / 100);
  result.set("with_tests", all.with_tests);
  result.set("all_right", all.all_right);
  result.set("all_right_share_of_tested", pct(all.all_right, all.with_tests) / 100);
  result.set("valid_taken", all.valid_taken);
  result.set("valid", all.valid);
  result.set("invalid_refused", all.invalid_refused);
  result.set("invalid", all.invalid);
  result.set("past_max_threads", narrowed);
  result.set("compile_ms_p50", quantile(compile_s, 0.5) * 1e3);
  result.set("compile_ms_p99", quantile(compile_s, 0.99) * 1e3);
  if (vocab) {
    result.set("tokenizer", tok_dir);
    result.set("vocab", static_cast<int64_t>(vocab->size()));
    result.set("first_mask_ms_p50", quantile(first_mask_s, 0.5) * 1e3);
    result.set("first_mask_ms_p99", quantile(first_mask_s, 0.99) * 1e3);
    result.set("time_to_first_mask_ms_p50", quantile(ttfm, 0.5) * 1e3);
    result.set("time_to_first_mask_ms_p99", quantile(ttfm, 0.99) * 1e3);
    result.set("token_masks", static_cast<int64_t>(mask_s.size()));
    result.set("token_mask_us_p50", quantile(mask_s, 0.5) * 1e6);
    result.set("token_mask_us_p99", quantile(mask_s, 0.99) * 1e6);
    result.set("token_mask_us_max", quantile(mask_s, 1.0) * 1e6);
    result.set("valid_tokens_refused", tokens_refused);
  }
  result.set("subsets", json::Value(std::move(per_subset)));
  result.set("refused", json::Value(std::move(refused)));
  result.set("rows", json::Value(std::move(rows)));
  write_json(o.get("--json", ""), result);
  return 0;
}

}  // namespace kvpr::bench

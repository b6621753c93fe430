// kvpr-bench tokenize [--tokenizer DIR] [--corpus FILE] [--mib N] [--reps N] [--json FILE]
// Tokenizer throughput with the fast paths (hand-written splitters for GPT-2's, Llama-3's and
// Qwen2's patterns) and without (Oniguruma runs every pattern): MB of text per second, each the
// median of --reps passes over the same text, and whether both give the same ids.
#include "bench/commands.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "engine/base/error.h"
#include "engine/base/json.h"
#include "engine/model/demo_model.h"
#include "engine/text/tokenizer.h"
#include "engine/text/unicode.h"

namespace kvpr::bench {

namespace {
// The text: the corpus file's strings (a JSON list) joined by newlines, repeated to `mib` MiB;
// without a file, English prose, code and numbers.
std::string make_text(const std::string& corpus, double mib) {
  std::string unit;
  if (!corpus.empty()) {
    for (const auto& s : json::parse_file(corpus).as_array()) unit += s.as_string() + "\n";
  } else {
    unit = "The quick brown fox jumps over the lazy dog. It's 2026; the cache holds 1,048,576 tokens.\n"
           "def f(x):\n    return {\"key\": [1, 2, 3], 'v': x ** 2}  # a comment\n"
           "Numbers 3.14159 and 2718281828, words like don't, we'll, THEY'RE, and   spaced   text.\n";
  }
  KVPR_CHECK(!unit.empty(), corpus, ": no strings");
  std::string text;
  const size_t want = static_cast<size_t>(mib * 1024 * 1024);
  while (text.size() < want) text += unit;
  return text;
}

struct Pass {
  double mb_per_s;
  std::vector<int32_t> ids;
};

Pass measure(const Tokenizer& t, const std::string& text, int reps) {
  Pass p{};
  const double s = time_median(reps, [&] { p.ids = t.encode(text, false); });
  p.mb_per_s = static_cast<double>(text.size()) / 1e6 / s;
  return p;
}
}  // namespace

int cmd_tokenize(const Args& args) {
  const Options a(args, {"--tokenizer", "--corpus", "--mib", "--reps", "--json"});
  const std::string dir = a.get("--tokenizer", default_tokenizer_dir());
  const int reps = std::max(1, a.get_int("--reps", 5));
  const std::string text = make_text(a.get("--corpus", ""), a.get_double("--mib", 4.0));
  KVPR_CHECK(unicode::available(), "kvpr-bench tokenize compares with Oniguruma: build with KVPR_TEXT_LIBS=ON");
  Tokenizer fast = Tokenizer::load(dir);
  Tokenizer general = fast;
  general.set_fast_paths(false);
  // One pass each first, so that both time a warm cache of pieces (the copies share it; the
  // BPE of a piece is the same whichever path cut it).
  measure(fast, text, 1);
  measure(general, text, 1);
  const Pass f = measure(fast, text, reps), g = measure(general, text, reps);
  const bool same = f.ids == g.ids;
  std::printf("tokenizer %s, %.1f MiB of text, %zu ids, median of %d\n", dir.c_str(), text.size() / 1048576.0,
              f.ids.size(), reps);
  std::printf("  fast paths   %8.2f MB/s\n  Oniguruma    %8.2f MB/s\n  fast / Oniguruma %.2fx, same ids: %s\n", f.mb_per_s,
              g.mb_per_s, f.mb_per_s / g.mb_per_s, same ? "yes" : "NO");
  if (const std::string out = a.get("--json", ""); !out.empty()) {
    json::Object o{{"tokenizer", dir}, {"text_bytes", static_cast<int64_t>(text.size())},
                   {"ids", static_cast<int64_t>(f.ids.size())}, {"reps", reps}, {"fast_mb_per_s", f.mb_per_s},
                   {"oniguruma_mb_per_s", g.mb_per_s}, {"speedup", f.mb_per_s / g.mb_per_s}, {"same_ids", same}};
    std::ofstream(out) << json::Value(o).dump() << "\n";
  }
  return same ? 0 : 1;
}

}  // namespace kvpr::bench

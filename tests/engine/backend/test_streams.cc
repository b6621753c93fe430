// The CPU backend's streams: copies on H2D/D2H run on their own threads, in order, ordered
// against compute by events, paced by the emulated link; and traces record them.
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <cstring>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/base/error.h"
#include "engine/decode/generator.h"
#include "engine/base/json.h"
#include "engine/model/opt_model.h"
#include "tests/test_util.h"

using namespace kvpr;

TEST(CpuStreams, CopiesAreOrderedAndEventsWait) {
  CpuBackend be;
  be.set_emulated_link_gbps(0.1);  // 1 MB -> 10 ms
  Tensor host = be.alloc_pinned(DType::U8, {1 << 20});
  std::memset(host.data(), 7, host.nbytes());
  Tensor dev = be.alloc(DType::U8, {1 << 20});
  Tensor back = be.alloc_pinned(DType::U8, {1 << 20});
  Event start = be.record(Stream::H2D);
  be.copy(dev, host, Stream::H2D, "up");
  Event up = be.record(Stream::H2D);
  // The D2H stream waits for the upload before copying back.
  be.wait(Stream::D2H, up);
  be.copy(back, dev, Stream::D2H, "down");
  Event down = be.record(Stream::D2H);
  be.synchronize(down);
  EXPECT_EQ(static_cast<uint8_t*>(back.data())[12345], 7);
  // Pacing is a lower bound: 1 MiB at 0.1 GB/s cannot take less than 10.5 ms.
  EXPECT_GE(be.elapsed_ms(start, up), 10.0);
}

TEST(CpuStreams, ComputeWaitsForACopy) {
  CpuBackend be;
  be.set_emulated_link_gbps(0.05);
  Tensor host = be.alloc_pinned(DType::F32, {1 << 18});
  for (int64_t i = 0; i < host.numel(); ++i) host.data_as<float>()[i] = 1.f;
  Tensor dev = be.alloc(DType::F32, {1 << 18});
  be.copy(dev, host, Stream::H2D);
  be.wait(Stream::Compute, be.record(Stream::H2D));
  Tensor sum = be.alloc(DType::F32, {1 << 18});
  be.add(sum, dev, dev);
  EXPECT_EQ(sum.data_as<float>()[(1 << 18) - 1], 2.f);  // the copy had landed
}

TEST(Trace, KvprRunRecordsEveryStreamAndTheSplit) {
  CpuBackend be;
  Tracer tracer;
  be.set_tracer(&tracer);
  OptModel model(be, test::data_path("opt/pre_ln_safetensors"));
  test::TempDir tmp;
  KvRuntimeOptions o;
  o.kv_dtype = DType::F32;
  o.mode = KvMode::Kvpr;
  o.forced_split = 4;
  auto kv = model.make_kv_runtime(1, 32, o);
  std::vector<int32_t> toks(10, 5);
  Tensor logits = Tensor::host(DType::F32, {1, model.config().vocab_size});
  model.forward({ForwardChunk{toks.data(), 10, 0, 0}}, *kv, logits);
  model.forward({ForwardChunk{toks.data(), 1, 10, 0}}, *kv, logits);
  be.synchronize();
  tracer.write(tmp.file("trace.json"));
  json::Value doc = json::parse_file(tmp.file("trace.json"));
  std::set<std::string> tracks;
  bool x_copy = false, kv_copy = false, linear_flops = false, split_counter = false, store = false;
  for (const auto& e : doc.find("traceEvents")->as_array()) {
    const std::string& ph = e.find("ph")->as_string();
    if (ph == "M" && e.find("name")->as_string() == "thread_name")
      tracks.insert(e.find("args")->find("name")->as_string());
    if (ph == "X") {
      const std::string& n = e.find("name")->as_string();
      EXPECT_GE(e.find("dur")->as_double(), 0);
      if (n == "L1 X[0:l]") x_copy = e.find("args")->find("bytes")->as_int() == 4 * 32 * 4;
      if (n == "L1 K[l:s']") kv_copy = e.find("args")->find("bytes")->as_int() == 6 * 32 * 4;
      if (n.find("linear") != std::string::npos && e.find("args")->find("flops")) linear_flops = true;
      if (n == "L0 K new") store = true;
    }
    if (ph == "C" && e.find("name")->as_string() == "split l" && e.find("args")->find("l")->as_double() == 4)
      split_counter = true;
  }
  EXPECT_TRUE(tracks.count("compute") && tracks.count("h2d") && tracks.count("d2h"));
  EXPECT_TRUE(x_copy) << "X[0:l] copy of 4 tokens";
  EXPECT_TRUE(kv_copy) << "K[l:s'] copy of the other 6";
  EXPECT_TRUE(linear_flops);
  EXPECT_TRUE(store);
  EXPECT_TRUE(split_counter);
}

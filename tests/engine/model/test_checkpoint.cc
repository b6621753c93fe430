// Checkpoint reading: every supported layout loads, and every malformed input gets an
// error naming the file and the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/model/checkpoint.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/base/error.h"
#include "engine/model/opt_model.h"
#include "tests/test_util.h"

using namespace kvpr;
namespace fs = std::filesystem;

namespace {

std::string copy_fixture(const std::string& name, const test::TempDir& tmp) {
  std::string dst = tmp.file(name);
  fs::copy(test::data_path("opt/" + name), dst, fs::copy_options::recursive);
  return dst;
}

std::string read_all(const std::string& path) { return test::read_file(path); }
void write_all(const std::string& path, const std::string& s) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << s;
}

// Loads the model in `dir` and returns the error message (empty if it loaded).
std::string load_error(const std::string& dir) {
  CpuBackend be;
  try {
    load_model(be, dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Checkpoint, LoadsEveryFixtureLayout) {
  for (const char* name : {"pre_ln_safetensors", "post_ln_proj_sharded", "decoder_prefix_bin", "fp16_bin_sharded",
                           "bf16_safetensors"}) {
    CheckpointDir ck(test::data_path(std::string("opt/") + name));
    EXPECT_FALSE(ck.tensors().empty()) << name;
    EXPECT_EQ(load_error(test::data_path(std::string("opt/") + name)), "") << name;
  }
  CheckpointDir sharded(test::data_path("opt/fp16_bin_sharded"));
  EXPECT_EQ(sharded.format(), "pytorch zip, 3 shards");
  const TensorRecord* e = sharded.find("model.decoder.embed_tokens.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dtype, DType::F16);
  EXPECT_EQ(e->shape, (Shape{96, 32}));
}

TEST(Checkpoint, TorchZipAndSafetensorsAgreeOnTheSameTensors) {
  // Re-save the .bin fixture's tensors as safetensors with our writer and compare bytes.
  test::TempDir tmp;
  CheckpointDir bin(test::data_path("opt/decoder_prefix_bin"));
  std::vector<TensorToWrite> tw;
  for (const auto& r : bin.tensors()) tw.push_back({r.name, r.dtype, r.shape, r.data});
  write_safetensors(tmp.file("model.safetensors"), tw);
  CheckpointDir st(tmp.path());
  ASSERT_EQ(st.tensors().size(), bin.tensors().size());
  for (const auto& r : bin.tensors()) {
    const TensorRecord* s = st.find(r.name);
    ASSERT_NE(s, nullptr) << r.name;
    EXPECT_EQ(s->shape, r.shape);
    EXPECT_EQ(std::memcmp(s->data, r.data, r.nbytes()), 0) << r.name;
  }
}

TEST(Checkpoint, NoWeightsInDirectory) {
  test::TempDir tmp;
  std::ofstream(tmp.file("config.json")) << read_all(test::data_path("opt/pre_ln_safetensors/config.json"));
  EXPECT_HAS(load_error(tmp.path()), "no weights found");
}

TEST(Checkpoint, TruncatedSafetensors) {
  test::TempDir tmp;
  std::string d = copy_fixture("pre_ln_safetensors", tmp);
  std::string f = d + "/model.safetensors";
  std::string bytes = read_all(f);
  write_all(f, bytes.substr(0, bytes.size() - 100));
  std::string msg = load_error(d);
  EXPECT_HAS(msg, "model.safetensors");
  EXPECT_HAS(msg, "overrun");
  EXPECT_HAS(msg, "truncated");
  write_all(f, bytes.substr(0, 5));
  EXPECT_HAS(load_error(d), "truncated safetensors file");
}

TEST(Checkpoint, HeaderOverrun) {
  test::TempDir tmp;
  std::string d = copy_fixture("pre_ln_safetensors", tmp);
  std::string f = d + "/model.safetensors";
  std::string bytes = read_all(f);
  uint64_t huge = 1ull << 40;
  std::memcpy(bytes.data(), &huge, 8);
  write_all(f, bytes);
  EXPECT_HAS(load_error(d), "header length 1099511627776 overruns the file");
}

TEST(Checkpoint, BadHeaderJson) {
  test::TempDir tmp;
  std::string d = copy_fixture("pre_ln_safetensors", tmp);
  std::string f = d + "/model.safetensors";
  std::string bytes = read_all(f);
  bytes[8] = '[';  // header no longer an object / valid JSON
  bytes[9] = '{';
  write_all(f, bytes);
  std::string msg = load_error(d);
  EXPECT_HAS(msg, "model.safetensors");
  EXPECT_HAS(msg, "invalid JSON");
}

TEST(Checkpoint, UnsupportedDtypeNamesTensor) {
  test::TempDir tmp;
  float v[4] = {1, 2, 3, 4};
  // Hand-written header with an F64 entry.
  std::string h = R"({"w":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})";
  uint64_t n = h.size();
  std::string bytes(reinterpret_cast<char*>(&n), 8);
  bytes += h;
  bytes.append(reinterpret_cast<char*>(v), 16);
  write_all(tmp.file("x.safetensors"), bytes);
  try {
    MappedFile mf(tmp.file("x.safetensors"));
    read_safetensors(mf);
    FAIL();
  } catch (const Error& e) {
    EXPECT_HAS(e.what(), "x.safetensors: tensor 'w': unsupported dtype F64");
  }
}

TEST(Checkpoint, WrongShapeSaysExpectedAndFound) {
  test::TempDir tmp;
  std::string d = copy_fixture("pre_ln_safetensors", tmp);
  std::string cfg = read_all(d + "/config.json");
  size_t p = cfg.find("\"ffn_dim\": 64");
  ASSERT_NE(p, std::string::npos);
  cfg.replace(p, 13, "\"ffn_dim\": 65");
  write_all(d + "/config.json", cfg);
  std::string msg = load_error(d);
  EXPECT_HAS(msg, "model.safetensors: tensor 'model.decoder.layers.0.fc1.weight' has shape [64, 32], expected [65, 32]");
}

TEST(Checkpoint, MissingTensor) {
  test::TempDir tmp;
  std::string d = copy_fixture("pre_ln_safetensors", tmp);
  CheckpointDir ck(d);
  std::vector<TensorToWrite> tw;
  for (const auto& r : ck.tensors())
    if (r.name != "model.decoder.layers.1.self_attn.v_proj.bias") tw.push_back({r.name, r.dtype, r.shape, r.data});
  std::string out = tmp.file("m2");
  fs::create_directories(out);
  write_safetensors(out + "/model.safetensors", tw);
  fs::copy(d + "/config.json", out + "/config.json");
  EXPECT_HAS(load_error(out), "missing tensor 'model.decoder.layers.1.self_attn.v_proj.bias'");
}

TEST(Checkpoint, BadConfig) {
  test::TempDir tmp;
  std::string d = copy_fixture("pre_ln_safetensors", tmp);
  write_all(d + "/config.json", "{\"model_type\": \"opt\", ");
  EXPECT_HAS(load_error(d), "config.json: invalid JSON");
  write_all(d + "/config.json", R"({"model_type": "gpt_neox"})");
  EXPECT_HAS(load_error(d), "config.json: model_type \"gpt_neox\" is not supported (supported: opt, llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, gemma2, gemma3_text, gemma3, mistral3, phi3 or gpt_oss)");
  write_all(d + "/config.json", R"({"model_type": "llama"})");
  EXPECT_HAS(load_error(d), "config.json: missing \"vocab_size\"");
  write_all(d + "/config.json", R"({"model_type": "opt", "hidden_size": 32})");
  EXPECT_HAS(load_error(d), "config.json: missing \"vocab_size\"");
  std::string good = read_all(test::data_path("opt/pre_ln_safetensors/config.json"));
  size_t p = good.find("\"hidden_size\": 32");
  ASSERT_NE(p, std::string::npos);
  write_all(d + "/config.json", good.substr(0, p) + "\"hidden_size\": \"32\"" + good.substr(p + 17));
  EXPECT_HAS(load_error(d), "config.json: \"hidden_size\": expected an integer, found a string");
  fs::remove(d + "/config.json");
  EXPECT_HAS(load_error(d), "no config.json");
}

TEST(Checkpoint, TruncatedTorchZip) {
  test::TempDir tmp;
  std::string d = copy_fixture("decoder_prefix_bin", tmp);
  std::string f = d + "/pytorch_model.bin";
  std::string bytes = read_all(f);
  write_all(f, bytes.substr(0, bytes.size() / 2));
  std::string msg = load_error(d);
  EXPECT_HAS(msg, "pytorch_model.bin");
  EXPECT_HAS(msg, "not a zip archive");
  write_all(f, "not a checkpoint at all, just some text that is long enough");
  EXPECT_HAS(load_error(d), "pytorch_model.bin: not a zip archive");
}

TEST(Checkpoint, CorruptPickle) {
  test::TempDir tmp;
  std::string d = copy_fixture("decoder_prefix_bin", tmp);
  std::string f = d + "/pytorch_model.bin";
  std::string bytes = read_all(f);
  size_t p = bytes.find("_rebuild_tensor_v2");
  ASSERT_NE(p, std::string::npos);
  // Overwrite the pickle just after the first global with an invalid opcode.
  bytes[p + 19] = '\xff';
  write_all(f, bytes);
  EXPECT_HAS(load_error(d), "pytorch_model.bin: cannot read data.pkl");
}

TEST(Checkpoint, IndexListsATensorItsShardLacks) {
  test::TempDir tmp;
  std::string d = copy_fixture("post_ln_proj_sharded", tmp);
  std::string idx = read_all(d + "/model.safetensors.index.json");
  size_t p = idx.find("\"weight_map\": {");
  ASSERT_NE(p, std::string::npos);
  idx.insert(p + 15, "\"model.decoder.ghost\": \"model-00001-of-00002.safetensors\", ");
  write_all(d + "/model.safetensors.index.json", idx);
  EXPECT_HAS(load_error(d), "tensor 'model.decoder.ghost' is listed in model-00001-of-00002.safetensors but that file does not contain it");
}

// transformers >= 4.56 saves the dtype as "dtype", earlier versions as "torch_dtype".
TEST(Checkpoint, DtypeUnderEitherName) {
  test::TempDir tmp;
  std::string d = copy_fixture("pre_ln_safetensors", tmp);
  std::string cfg = read_all(d + "/config.json");
  const size_t p = cfg.find("\"torch_dtype\": \"float32\"");
  ASSERT_NE(p, std::string::npos);
  write_all(d + "/config.json", cfg.substr(0, p) + "\"dtype\": \"float16\"" + cfg.substr(p + 24));
  CpuBackend be;
  EXPECT_EQ(load_model(be, d)->spec().torch_dtype, "float16");
  write_all(d + "/config.json", cfg.substr(0, p) + "\"dtype\": \"float16\", \"torch_dtype\": \"bfloat16\"" + cfg.substr(p + 24));
  EXPECT_EQ(load_model(be, d)->spec().torch_dtype, "bfloat16");
}

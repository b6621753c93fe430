// The NCCL weight broadcast (engine/backend/weight_broadcast.h) between two processes, as kvprd's
// workers run it, on the emulated build's devices and NCCL stand-in
// (engine/backend/emulated/nccl_emu.h): every rank ends with the bits of a direct load while
// only rank 0 reads the tensors, and a rank that leaves mid-way makes the other's load fail with
// NCCL's error instead of waiting forever; quantized weights cross quantized. Built in the emulated build only (two ranks on one
// real GPU is not a configuration NCCL accepts).
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "engine/backend/backend.h"
#include "engine/model/demo_model.h"
#include "engine/model/model.h"
#include "engine/backend/weight_broadcast.h"
#include "tests/test_util.h"

namespace kvpr {
namespace {

// How a rank takes part: to the end, or leaving (its process exits) at its first progress
// report: rank 0's comes while it reads the checkpoint, a receiver's once it has received the
// first piece of the broadcast.
enum class Part { Whole, Leaves };

// One rank's load of `dir` on its process's emulated device 0, in a child process: "ok
// <digest> <checkpoint bytes read>" or "error <message>" on the returned pipe.
pid_t start_rank(const std::string& dir, const std::string& id, int rank, Part part, int* out_fd) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid != 0) {
    close(fds[1]);
    *out_fd = fds[0];
    return pid;
  }
  close(fds[0]);
  std::string result;
  try {
    auto backend = create_backend("cuda", 0);
    auto bc = make_nccl_broadcaster(id, rank, 2, 0);
    ModelLoadOptions lo;
    lo.broadcast = bc.get();
    lo.verify_weights = true;
    if (part == Part::Leaves) lo.progress = [](size_t, size_t) { _exit(0); };
    auto model = load_model(*backend, dir, lo);
    result = "ok " + model->weights_digest() + " " + std::to_string(model->checkpoint_bytes_read()) + " " +
             (model->kept_quantized() ? "kept" : "dense");
  } catch (const std::exception& e) {
    result = std::string("error ") + e.what();
  }
  ssize_t ignored = write(fds[1], result.data(), result.size());
  (void)ignored;
  _exit(0);
}

struct RankResult {
  std::string text;  // what it wrote ("" when it left)
  bool ended = false;  // exited within the deadline
};

// Runs the two ranks; each must end within 60 s (a rank still waiting then is killed and reported
// as not ended: a hang).
std::vector<RankResult> run_ranks(const std::string& dir, Part part0, Part part1) {
  const std::string id = nccl_unique_id_hex();
  int fd[2] = {-1, -1};
  pid_t pid[2] = {start_rank(dir, id, 0, part0, &fd[0]), start_rank(dir, id, 1, part1, &fd[1])};
  std::vector<RankResult> out(2);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int left = 2; left > 0 && std::chrono::steady_clock::now() < deadline;) {
    for (int r = 0; r < 2; ++r) {
      int status = 0;
      if (pid[r] > 0 && !out[r].ended && waitpid(pid[r], &status, WNOHANG) == pid[r]) {
        out[r].ended = true;
        --left;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int r = 0; r < 2; ++r) {
    if (!out[r].ended && pid[r] > 0) {
      kill(pid[r], SIGKILL);
      waitpid(pid[r], nullptr, 0);
    }
    char buf[4096];
    for (ssize_t n; (n = read(fd[r], buf, sizeof buf)) > 0;) out[r].text.append(buf, static_cast<size_t>(n));
    close(fd[r]);
  }
  return out;
}

class WeightBroadcast : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("KVPR_EMULATED_GPUS", "1", 0);  // each rank's process sees its own device 0
    try {
      create_backend("cuda", 0);
    } catch (const std::exception& e) {
      GTEST_SKIP() << "no emulated device in this process: " << e.what();
    }
    write_demo_model(tmp_.path(), default_demo_spec(), default_tokenizer_dir());
  }
  test::TempDir tmp_;
};

TEST_F(WeightBroadcast, EveryRankHoldsTheBitsOfADirectLoadAndOnlyRankZeroReadsTheTensors) {
  // The reference: a load straight from the checkpoint, read back from the device.
  auto backend = create_backend("cuda", 0);
  ModelLoadOptions lo;
  lo.verify_weights = true;
  const std::string direct = load_model(*backend, tmp_.path(), lo)->weights_digest();
  ASSERT_EQ(direct.size(), 16u);

  const auto r = run_ranks(tmp_.path(), Part::Whole, Part::Whole);
  ASSERT_TRUE(r[0].ended && r[1].ended) << "a rank hung";
  char d0[32] = {}, d1[32] = {};
  size_t read0 = 0, read1 = 0;
  ASSERT_EQ(std::sscanf(r[0].text.c_str(), "ok %16s %zu", d0, &read0), 2) << r[0].text;
  ASSERT_EQ(std::sscanf(r[1].text.c_str(), "ok %16s %zu", d1, &read1), 2) << r[1].text;
  EXPECT_EQ(std::string(d0), direct);
  EXPECT_EQ(std::string(d1), direct);
  // Bytes of the checkpoint's mapping each process touched (the kernel's count): every tensor
  // for rank 0, the header for the receiver (with what the kernel maps around a fault of cached
  // pages: 64 KiB, or one 2 MiB folio where the file system has large folios).
  const size_t file = std::filesystem::file_size(tmp_.file("model.safetensors"));
  EXPECT_GE(read0, file - 64 * 1024);
  EXPECT_LE(read1, (size_t{2} << 20) + (size_t{64} << 10));
  EXPECT_LT(read1, file / 4);
}

// Quantized checkpoints cross as they are stored (kvpr's layout, weight.h): rank 0 repacks, the
// receiver takes the layout and the bytes and keeps them quantized, bit for bit a direct load's.
// GPTQ with act order (each of q, k and v in an order of its own), OPT in GPTQ, fp8 blocks (the
// last ones partial), and gpt-oss's MXFP4 experts (which the architecture derives).
TEST_F(WeightBroadcast, QuantizedWeightsCrossAsStored) {
  for (const char* name : {"quantized/gptq_int4_g32_asym_desc_act", "quantized/opt_gptq_int4_g32_sym",
                           "quantized/fp8_block_partial", "gpt_oss/mxfp4_bf16"}) {
    const std::string dir = test::data_path(name);
    auto backend = create_backend("cuda", 0);
    ModelLoadOptions lo;
    lo.verify_weights = true;
    auto model = load_model(*backend, dir, lo);
    ASSERT_TRUE(model->kept_quantized()) << name;
    const std::string direct = model->weights_digest();
    model.reset();
    const auto r = run_ranks(dir, Part::Whole, Part::Whole);
    ASSERT_TRUE(r[0].ended && r[1].ended) << "a rank hung: " << name;
    for (int rank : {0, 1}) {
      char digest[32] = {}, kept[16] = {};
      size_t read = 0;
      ASSERT_EQ(std::sscanf(r[rank].text.c_str(), "ok %16s %zu %15s", digest, &read, kept), 3) << name << ": " << r[rank].text;
      EXPECT_EQ(std::string(digest), direct) << name << " rank " << rank;
      EXPECT_EQ(std::string(kept), "kept") << name << " rank " << rank;
    }
  }
}

TEST_F(WeightBroadcast, AReceiverGoneMidBroadcastFailsTheSenderWithNcclsError) {
  const auto r = run_ranks(tmp_.path(), Part::Whole, Part::Leaves);
  ASSERT_TRUE(r[0].ended) << "rank 0 hung after its receiver left";
  EXPECT_EQ(r[1].text, "");  // it left
  EXPECT_NE(r[0].text.find("error the NCCL weight broadcast failed: remote process exited"), std::string::npos)
      << r[0].text;
}

TEST_F(WeightBroadcast, TheSenderGoneFailsTheReceiverWithNcclsError) {
  const auto r = run_ranks(tmp_.path(), Part::Leaves, Part::Whole);
  ASSERT_TRUE(r[1].ended) << "rank 1 hung after rank 0 left";
  EXPECT_EQ(r[0].text, "");
  EXPECT_NE(r[1].text.find("error the NCCL weight broadcast failed: remote process exited"), std::string::npos)
      << r[1].text;
}

}  // namespace
}  // namespace kvpr

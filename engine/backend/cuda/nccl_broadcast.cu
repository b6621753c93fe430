// NCCL weight broadcast between worker processes (see weight_broadcast.h).
#include <nccl.h>

#include "engine/backend/cuda/cuda_check.h"
#include "engine/base/error.h"
#include "engine/backend/weight_broadcast.h"

#define NCCL_CHECK(expr)                                                                              \
  do {                                                                                                \
    ncclResult_t kvpr_r_ = (expr);                                                                    \
    if (kvpr_r_ != ncclSuccess)                                                                       \
      KVPR_THROW("NCCL error ", ncclGetErrorString(kvpr_r_), " in ", #expr, " at ", __FILE__, ":", __LINE__); \
  } while (0)

namespace kvpr {

namespace {

class NcclBroadcaster final : public WeightBroadcaster {
 public:
  NcclBroadcaster(const ncclUniqueId& id, int rank, int ranks, int device) : rank_(rank), ranks_(ranks) {
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    NCCL_CHECK(ncclCommInitRank(&comm_, ranks, id, rank));
  }
  ~NcclBroadcaster() override {
    if (comm_) ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int ranks() const override { return ranks_; }
  void broadcast(const Tensor& t) override {
    KVPR_CHECK(t.memory() == MemoryKind::Device, "NCCL broadcast needs device memory, got ", t.describe());
    // Bytes as int8: every dtype goes through unchanged.
    NCCL_CHECK(ncclBroadcast(t.data(), t.data(), t.nbytes(), ncclInt8, 0, comm_, stream_));
  }
  // Every broadcast done, and none failed: a peer that died mid-way ends NCCL's operations with
  // an asynchronous error, and weights half received must never be served.
  void finish() override {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      KVPR_THROW("the NCCL weight broadcast failed: ", ncclGetErrorString(async));
    }
  }

 private:
  int rank_, ranks_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

bool nccl_available() { return true; }

std::string nccl_unique_id_hex() {
  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char c : id.internal) {
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}

std::unique_ptr<WeightBroadcaster> make_nccl_broadcaster(const std::string& id_hex, int rank, int ranks, int device) {
  KVPR_CHECK(id_hex.size() == 2 * NCCL_UNIQUE_ID_BYTES, "NCCL id must be ", 2 * NCCL_UNIQUE_ID_BYTES, " hex digits");
  KVPR_CHECK(rank >= 0 && rank < ranks, "NCCL rank ", rank, " out of ", ranks);
  ncclUniqueId id;
  auto nib = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    KVPR_THROW("bad hex digit in NCCL id");
  };
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i)
    id.internal[i] = static_cast<char>(nib(id_hex[2 * i]) * 16 + nib(id_hex[2 * i + 1]));
  return std::make_unique<NcclBroadcaster>(id, rank, ranks, device);
}

}  // namespace kvpr

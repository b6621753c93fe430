// The NCCL stand-in of nccl_emu.h: a communicator is a shared segment between the ranks'
// processes.
#define KVPR_EMU_NCCL_IMPL 1
#include "engine/backend/emulated/simt_emu.h"
// clang-format off
#include "engine/backend/emulated/cuda_runtime_emu.h"
#include "engine/backend/emulated/nccl_emu.h"
// clang-format on

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>

namespace kvpr_emu {
constexpr int kMaxRanks = 64;
constexpr size_t kChunk = size_t{4} << 20;  // bytes in flight per step of a broadcast

// The shared segment: who joined, and one chunk of a broadcast in flight. A new segment reads
// as zeros (shm_open + ftruncate), so every rank can create it and none initializes it.
struct Segment {
  std::atomic<int> joined;
  std::atomic<int> aborted;
  std::atomic<pid_t> pids[kMaxRanks];
  std::atomic<uint64_t> posted;           // chunks the root has put into data, over the comm's life
  std::atomic<uint64_t> taken[kMaxRanks];  // chunks each rank has copied out
  char data[kChunk];
};
}  // namespace kvpr_emu

struct ncclComm {
  int rank = 0, nranks = 0;
  std::string name;  // the segment's, while it may still be unlinked
  kvpr_emu::Segment* seg = nullptr;
  size_t bytes = 0;
  bool blocking = true;
  std::atomic<int> error{ncclSuccess};  // ncclInProgress until every rank joined (non-blocking init)
};

namespace kvpr_emu {
namespace {


std::string segment_name(const ncclUniqueId& id) {
  static const char* hex = "0123456789abcdef";
  std::string s = "/kvpr-nccl-";
  for (int i = 0; i < 16; ++i) {
    const unsigned char c = static_cast<unsigned char>(id.internal[i]);
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}

// A process that has exited is gone even while its parent has not reaped it (a zombie): NCCL
// sees a peer's exit as its connections close, not at its reaping.
bool alive(pid_t pid) {
  if (pid <= 0 || (kill(pid, 0) != 0 && errno != EPERM)) return false;
  char path[32], stat[256] = {};
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return true;
  const size_t n = std::fread(stat, 1, sizeof stat - 1, f);
  std::fclose(f);
  const char* paren = std::strrchr(stat, ')');  // "pid (comm) S ...": comm may hold anything
  return !(n > 0 && paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X'));
}

// Whether the communicator can go on: nobody aborted it, and every rank that joined is alive.
bool healthy(ncclComm* c) {
  if (c->seg->aborted.load()) return false;
  for (int r = 0; r < c->nranks; ++r) {
    const pid_t p = c->seg->pids[r].load();
    if (p != 0 && !alive(p)) return false;
  }
  return true;
}

// Waits until `ready` holds; false (the communicator marked failed) when it cannot go on.
template <typename F>
bool wait_for(ncclComm* c, F ready) {
  for (int spins = 0;; ++spins) {
    if (ready()) return true;
    if (spins % 64 == 0 && !healthy(c)) {
      c->error = ncclRemoteError;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(spins < 1000 ? 20 : 500));
  }
}

bool all_joined(ncclComm* c) {
  if (c->seg->joined.load() < c->nranks) return false;
  // Past the rendezvous the name is not needed: rank 0 unlinks it, so nothing is left in
  // /dev/shm whatever happens to the processes later.
  if (c->rank == 0 && !c->name.empty()) {
    shm_unlink(c->name.c_str());
    c->name.clear();
  }
  return true;
}

}  // namespace

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return ncclInvalidArgument;
  std::random_device rd;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) id->internal[i] = static_cast<char>(rd() & 0xff);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  if (!comm || nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  auto* c = new ncclComm;
  c->rank = rank;
  c->nranks = nranks;
  c->name = segment_name(id);
  c->bytes = sizeof(Segment);
  c->blocking = !(config && config->blocking == 0);
  const int fd = shm_open(c->name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(c->bytes)) != 0) {
    if (fd >= 0) close(fd);
    delete c;
    return ncclSystemError;
  }
  void* p = mmap(nullptr, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    delete c;
    return ncclSystemError;
  }
  c->seg = static_cast<Segment*>(p);
  c->seg->pids[rank] = getpid();
  c->seg->joined.fetch_add(1);
  *comm = c;
  if (!c->blocking) {
    c->error = ncclInProgress;
    return ncclInProgress;
  }
  // Blocking: every rank, or (as NCCL would hang) until a joined rank dies or someone aborts.
  return wait_for(c, [&] { return all_joined(c); }) ? ncclSuccess : ncclRemoteError;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return kvpr_emu::ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (!comm || !error) return ncclInvalidArgument;
  if (comm->error.load() == ncclInProgress) {
    if (all_joined(comm)) comm->error = ncclSuccess;
    else if (!healthy(comm)) comm->error = ncclRemoteError;
  }
  *error = static_cast<ncclResult_t>(comm->error.load());
  return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  if (!comm || root < 0 || root >= comm->nranks || datatype != ncclInt8) return ncclInvalidArgument;
  if (comm->error.load() != ncclSuccess) return ncclInvalidUsage;  // in progress or failed
  const bool is_root = comm->rank == root;
  // Queued as a kernel: its buffer must be this device's memory, checked at the launch.
  submit_launch(
      stream,
      [=] {
        Segment* s = comm->seg;
        // Every receiver has taken chunk `seq` (the root's wait before it writes the next, and at the end).
        auto all_taken = [&](uint64_t seq) {
          return wait_for(comm, [&] {
            for (int r = 0; r < comm->nranks; ++r)
              if (r != root && s->taken[r].load() < seq) return false;
            return true;
          });
        };
        for (size_t off = 0; off < count && comm->error.load() == ncclSuccess; off += kChunk) {
          const size_t n = std::min(kChunk, count - off);
          if (is_root) {
            const uint64_t seq = s->posted.load();
            if (!all_taken(seq)) return;
            cross_device_link(sendbuff, n);  // out of the root's device, into host memory
            std::memcpy(s->data, static_cast<const char*>(sendbuff) + off, n);
            s->posted.store(seq + 1);
          } else {
            const uint64_t want = s->taken[comm->rank].load() + 1;
            if (!wait_for(comm, [&] { return s->posted.load() >= want; })) return;
            cross_device_link(recvbuff, n);  // from host memory into this rank's device
            std::memcpy(static_cast<char*>(recvbuff) + off, s->data, n);
            s->taken[comm->rank].store(want);
          }
        }
        if (is_root && comm->error.load() == ncclSuccess) all_taken(s->posted.load());  // the last chunk
      },
      {is_root ? sendbuff : static_cast<const void*>(recvbuff)});
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }

namespace {
// Frees a communicator; abort also tells every other rank (their waits end with ncclRemoteError).
ncclResult_t release(ncclComm_t comm, bool abort) {
  if (!comm) return ncclSuccess;
  if (abort) comm->seg->aborted.store(1);
  if (!comm->name.empty()) shm_unlink(comm->name.c_str());  // nobody else will join now
  munmap(comm->seg, comm->bytes);
  delete comm;
  return ncclSuccess;
}
}  // namespace

ncclResult_t ncclCommAbort(ncclComm_t comm) { return release(comm, true); }
ncclResult_t ncclCommDestroy(ncclComm_t comm) { return release(comm, false); }

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error (shared memory)";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

}  // namespace kvpr_emu

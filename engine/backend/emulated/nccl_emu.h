// An NCCL stand-in for the emulated build (-DKVPR_EMULATED_CUDA=ON): the calls
// engine/backend/cuda/nccl_broadcast.cu makes, between the worker processes of one host over
// POSIX shared memory, with NCCL's blocking and failure semantics, so the weight broadcast runs
// without GPUs or NCCL.
//
// - ncclGetUniqueId: 128 random bytes; the first 16 name the shared segment (/kvpr-nccl-<hex>).
// - ncclCommInitRank(Config): each rank maps the segment and registers its pid; the call returns
//   once every rank has joined (blocking), or at once with the communicator in progress
//   (config.blocking = 0; ncclCommGetAsyncError says ncclInProgress until every rank joined).
//   A rank that never comes keeps the others waiting, as with NCCL: the caller bounds it.
// - ncclBroadcast: queued on the stream like a kernel (its buffers checked as a kernel's); when
//   the stream runs it the root copies its buffer through the segment in chunks and each other
//   rank copies them out, every chunk acknowledged by every receiver before the next. Each copy
//   crosses its device's emulated PCIe link (KVPR_EMULATED_LINK_GBPS), as NCCL's shared-memory
//   transport goes through host memory.
// - A rank whose process is gone (exited, reaped or not), or a communicator aborted anywhere,
//   ends the waits of the others: their operation stops and ncclCommGetAsyncError reports
//   ncclRemoteError, as NCCL reports a peer's failure. ncclCommAbort marks the segment aborted and frees the communicator.
// Include after the CUDA headers and cuda_runtime_emu.h; the macros at the end send
// nccl_broadcast.cu's calls here.
#pragma once

#include <nccl.h>

namespace kvpr_emu {

ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
const char* ncclGetErrorString(ncclResult_t result);

}  // namespace kvpr_emu

#if !defined(KVPR_EMU_NCCL_IMPL)
#define ncclGetUniqueId ::kvpr_emu::ncclGetUniqueId
#define ncclCommInitRank ::kvpr_emu::ncclCommInitRank
#define ncclCommInitRankConfig ::kvpr_emu::ncclCommInitRankConfig
#define ncclCommGetAsyncError ::kvpr_emu::ncclCommGetAsyncError
#define ncclBroadcast ::kvpr_emu::ncclBroadcast
#define ncclGroupStart ::kvpr_emu::ncclGroupStart
#define ncclGroupEnd ::kvpr_emu::ncclGroupEnd
#define ncclCommAbort ::kvpr_emu::ncclCommAbort
#define ncclCommDestroy ::kvpr_emu::ncclCommDestroy
#define ncclGetErrorString ::kvpr_emu::ncclGetErrorString
#endif

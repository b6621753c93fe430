// The emulated streams, events, stream capture and graphs of cuda_runtime_emu.h: work queues that
// run when the host waits (or as the schedule says), with CUDA's capture rules.
#define KVPR_EMU_RUNTIME_IMPL 1
#include "engine/backend/emulated/simt_emu.h"
// clang-format off
#include "engine/backend/emulated/cuda_runtime_emu.h"
// clang-format on
#include "engine/backend/emulated/cuda_runtime_emu_internal.h"

#include <memory>

namespace kvpr_emu {

using namespace internal;

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* out, unsigned flags) {
  Api a;
  if (!out) return fail(a.s, cudaErrorInvalidValue);
  // A blocking stream would synchronise implicitly with the legacy stream: not modelled.
  if (!(flags & cudaStreamNonBlocking)) return fail(a.s, cudaErrorNotSupported);
  if (!current(a.s)) return fail(a.s, cudaErrorNoDevice);
  auto st = std::make_shared<CUstream_st>();
  st->device = t_device;
  *out = st.get();
  a.s.streams[st.get()] = st;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Api a;
  if (capture_violation(a.s)) return cudaErrorStreamCaptureUnsupported;
  auto it = a.s.streams.find(stream);
  if (it == a.s.streams.end()) return fail(a.s, cudaErrorInvalidResourceHandle);
  auto st = it->second;
  run_until(a.s, st, st->submitted);  // queued work still runs
  a.s.streams.erase(it);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Api a;
  if (capture_violation(a.s)) return cudaErrorStreamCaptureUnsupported;
  auto st = stream_of(a.s, stream);
  if (!st) return fail(a.s, cudaErrorInvalidResourceHandle);
  host_wait(a.s, st, st->submitted);
  return cudaSuccess;
}

namespace {
std::shared_ptr<CUevent_st> event_of(State& s, cudaEvent_t e) {
  auto it = s.events.find(e);
  return it == s.events.end() ? nullptr : it->second;
}
}  // namespace

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* out, unsigned flags) {
  Api a;
  if (!out) return fail(a.s, cudaErrorInvalidValue);
  auto e = std::make_shared<CUevent_st>();
  e->timing = !(flags & cudaEventDisableTiming);
  *out = e.get();
  a.s.events[e.get()] = e;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* out) { return kvpr_emu::cudaEventCreateWithFlags(out, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  Api a;
  // Queued records and waits hold the event; the handle is gone now.
  return a.s.events.erase(e) ? cudaSuccess : fail(a.s, cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t stream) {
  Api a;
  auto e = event_of(a.s, ev);
  auto st = stream_of(a.s, stream);
  if (!e || !st) return fail(a.s, cudaErrorInvalidResourceHandle);
  const uint64_t gen = ++e->generation;
  e->recorded = true;
  e->captured = st->capture != nullptr;
  e->stream = st;
  State* s = &a.s;
  enqueue(a.s, st, [e, gen, s] {
    if (e->generation == gen) e->time_ms = now_ms(*s);
  });
  e->seq = st->submitted;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  Api a;
  auto e = event_of(a.s, ev);
  if (!e) return fail(a.s, cudaErrorInvalidResourceHandle);
  if (e->captured || capture_violation(a.s)) return fail(a.s, cudaErrorStreamCaptureUnsupported);
  if (e->recorded) host_wait(a.s, e->stream, e->seq);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t ev) {
  Api a;
  auto e = event_of(a.s, ev);
  if (!e) return fail(a.s, cudaErrorInvalidResourceHandle);
  if (e->captured) return fail(a.s, cudaErrorStreamCaptureUnsupported);  // a record inside a capture is no point in time
  return !e->recorded || e->stream->done >= e->seq ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t ev, unsigned) {
  Api a;
  auto e = event_of(a.s, ev);
  auto st = stream_of(a.s, stream);
  if (!e || !st) return fail(a.s, cudaErrorInvalidResourceHandle);
  if (st->capture) {
    // Inside a capture: an event of the same capture orders nothing more in one stream; one
    // recorded outside it would tie the graph to work outside (CUDA: capture isolation).
    if (e->captured && e->stream == st) return cudaSuccess;
    capture_violation(a.s);
    return fail(a.s, cudaErrorStreamCaptureIsolation);
  }
  // Joining another stream into a capture (fork/join across streams) is not modelled.
  if (e->captured) return fail(a.s, cudaErrorNotSupported);
  if (!e->recorded) return cudaSuccess;  // waiting on a never-recorded event waits for nothing
  State* s = &a.s;
  // The wait is for the record made before this call, even if the event is recorded again.
  enqueue(a.s, st, [s, other = e->stream, seq = e->seq] { run_until(*s, other, seq); });
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  Api a;
  auto e0 = event_of(a.s, start), e1 = event_of(a.s, end);
  if (!ms || !e0 || !e1) return fail(a.s, cudaErrorInvalidResourceHandle);
  if (!e0->timing || !e1->timing || !e0->recorded || !e1->recorded)
    return fail(a.s, cudaErrorInvalidResourceHandle);
  if (e0->captured || e1->captured) return fail(a.s, cudaErrorStreamCaptureUnsupported);
  if (e0->stream->done < e0->seq || e1->stream->done < e1->seq) return fail(a.s, cudaErrorNotReady);
  *ms = static_cast<float>(e1->time_ms - e0->time_ms);
  return cudaSuccess;
}

// ---- stream capture and graphs ----
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  Api a;
  auto st = stream_of(a.s, stream);
  if (!st) return fail(a.s, cudaErrorInvalidResourceHandle);
  if (st == a.s.devices[static_cast<size_t>(st->device)]->legacy)
    return fail(a.s, cudaErrorStreamCaptureUnsupported);  // as CUDA: not the legacy stream
  if (st->capture) return fail(a.s, cudaErrorIllegalState);
  // Relaxed mode and several captures at once are not modelled.
  if (mode == cudaStreamCaptureModeRelaxed || a.s.capturing) return fail(a.s, cudaErrorNotSupported);
  st->capture = std::make_shared<CUgraph_st>();
  st->capture_invalid = false;
  a.s.capturing = st;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  Api a;
  auto st = stream_of(a.s, stream);
  if (!st || !graph) return fail(a.s, cudaErrorInvalidValue);
  if (!st->capture) return fail(a.s, cudaErrorIllegalState);
  auto g = std::move(st->capture);
  st->capture = nullptr;
  a.s.capturing = nullptr;
  *graph = nullptr;
  if (st->capture_invalid) return fail(a.s, cudaErrorStreamCaptureInvalidated);
  *graph = g.get();
  a.s.graphs[g.get()] = std::move(g);
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  Api a;
  auto st = stream_of(a.s, stream);
  if (!st || !status) return fail(a.s, cudaErrorInvalidValue);
  *status = !st->capture ? cudaStreamCaptureStatusNone
                         : st->capture_invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  Api a;
  auto it = a.s.graphs.find(graph);
  if (!exec || it == a.s.graphs.end()) return fail(a.s, cudaErrorInvalidValue);
  auto e = std::make_shared<CUgraphExec_st>();
  e->nodes = it->second->nodes;  // the nodes hold their parameters by value, as an executable graph does
  *exec = e.get();
  a.s.execs[e.get()] = std::move(e);
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  Api a;
  auto it = a.s.execs.find(exec);
  auto st = stream_of(a.s, stream);
  if (it == a.s.execs.end() || !st) return fail(a.s, cudaErrorInvalidResourceHandle);
  if (st->capture) return fail(a.s, cudaErrorNotSupported);  // a graph launched into a capture: not modelled
  ++a.s.submissions;
  for (const auto& node : it->second->nodes) enqueue(a.s, st, node);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  Api a;
  // Launches already queued keep their own copies of the nodes.
  return a.s.execs.erase(exec) ? cudaSuccess : fail(a.s, cudaErrorInvalidValue);
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  Api a;
  return a.s.graphs.erase(graph) ? cudaSuccess : fail(a.s, cudaErrorInvalidValue);
}

}  // namespace kvpr_emu

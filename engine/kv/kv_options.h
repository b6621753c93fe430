// The KV runtime's settings as plain values (a front end's options set them before any engine
// exists: engine/decode/engine_options.h): the KV mode, the split model, and the rest of
// KvRuntimeOptions. The runtime itself is kv_runtime.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/base/dtype.h"
#include "engine/kv/link_profile.h"

namespace kvpr {

enum class KvMode { Resident, Offload, Kvpr, Recompute, CpuAttn, Auto };
inline constexpr KvMode kAllKvModes[] = {KvMode::Resident, KvMode::Offload, KvMode::Kvpr,
                                         KvMode::Recompute, KvMode::CpuAttn, KvMode::Auto};
const char* kv_mode_name(KvMode m);
bool parse_kv_mode(const std::string& s, KvMode* out);
bool kv_mode_uses_host(KvMode m);
bool kv_mode_stores_x(KvMode m);
// kvpr and auto: the split l is the scheduler's (from a link profile) unless forced.
bool kv_mode_splits(KvMode m);

// The split scheduler's model of a layer's time (split_scheduler.h).
enum class SplitModel { Paper, Pipeline };
const char* split_model_name(SplitModel m);

struct KvRuntimeOptions {
  KvMode mode = KvMode::Resident;
  DType kv_dtype = DType::F32;          // storage of K, V and X
  int64_t activation_cap = -1;          // X kept for the first N tokens of a sequence; -1 = all
  std::optional<int64_t> forced_split;  // kvpr, auto: this l for every sequence (capped by stored X)
  int host_attention_threads = 0;       // cpu-attn: threads of the host attention (0 = all)
  int64_t split_granularity = 16;       // l is a multiple of this (GEMM-friendly)
  SplitModel split_model = SplitModel::Pipeline;
  std::optional<LinkProfile> profile;   // kvpr without forced_split needs one
  bool adapt = true;                    // update the profile from each step's measurements
  // Column by column (docs/design.md §2): a step's sequences split into this many GPU batches, each
  // run through a layer before the next layer starts, so one pass over a layer's weights (and
  // one weight copy, with streamed weights) serves them all while the device holds the KV of
  // one batch at a time. 1: the whole step is one batch.
  int64_t gpu_batches = 1;
  // auto: device memory for the device tier, gpu_kv_bytes, or when gpu_kv_fraction >= 0 that
  // fraction of the device memory free once the step's buffers are set aside (as the host
  // modes' staging needs them; on a backend whose device is the host, of the host store's
  // size); capped at what mirrors every host block.
  double gpu_kv_bytes = 0;
  double gpu_kv_fraction = 0.9;
};

}  // namespace kvpr

#include "engine/kv/kv_options.h"

namespace kvpr {

const char* kv_mode_name(KvMode m) {
  switch (m) {
    case KvMode::Resident: return "resident";
    case KvMode::Offload: return "offload";
    case KvMode::Kvpr: return "kvpr";
    case KvMode::Recompute: return "recompute";
    case KvMode::CpuAttn: return "cpu-attn";
    case KvMode::Auto: return "auto";
  }
  return "?";
}

bool parse_kv_mode(const std::string& s, KvMode* out) {
  for (KvMode m : kAllKvModes)
    if (s == kv_mode_name(m)) {
      *out = m;
      return true;
    }
  return false;
}

bool kv_mode_uses_host(KvMode m) { return m != KvMode::Resident; }
bool kv_mode_stores_x(KvMode m) { return m == KvMode::Kvpr || m == KvMode::Recompute || m == KvMode::Auto; }
bool kv_mode_splits(KvMode m) { return m == KvMode::Kvpr || m == KvMode::Auto; }

const char* split_model_name(SplitModel m) { return m == SplitModel::Paper ? "paper" : "pipeline"; }

}  // namespace kvpr

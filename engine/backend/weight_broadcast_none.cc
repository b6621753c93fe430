// Builds without NCCL: weights are always read from disk.
#include "engine/base/error.h"
#include "engine/backend/weight_broadcast.h"

namespace kvpr {

bool nccl_available() { return false; }
std::string nccl_unique_id_hex() { KVPR_THROW("this build has no NCCL"); }
std::unique_ptr<WeightBroadcaster> make_nccl_broadcaster(const std::string&, int, int, int) {
  KVPR_THROW("this build has no NCCL");
}

}  // namespace kvpr

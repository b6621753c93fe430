// Loading weights once for several GPUs: the first worker reads the checkpoint and the
// others receive every tensor from it with NCCL (one communicator across the worker
// processes; the controller hands out the unique id). Built when NCCL is found.
#pragma once

#include <memory>
#include <string>

#include "engine/base/tensor.h"

namespace kvpr {

class WeightBroadcaster {
 public:
  virtual ~WeightBroadcaster() = default;
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  // Rank 0 sends `t` (device memory), the others receive into it. Collective: every rank
  // calls it for the same tensors in the same order.
  virtual void broadcast(const Tensor& t) = 0;
  virtual void finish() = 0;  // waits for every broadcast
};

bool nccl_available();
// A new unique id, hex encoded (the controller's side). Throws when NCCL is unavailable.
std::string nccl_unique_id_hex();
// Joins the communicator as `rank` of `ranks` on CUDA device `device` (blocks until all join).
std::unique_ptr<WeightBroadcaster> make_nccl_broadcaster(const std::string& id_hex, int rank, int ranks, int device);

}  // namespace kvpr

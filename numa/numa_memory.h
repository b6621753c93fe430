// A worker's host memory on its NUMA node: the engine's HostAllocator (the KV store, pinned
// staging) over hwloc, for the worker to use once placed (placement.h).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "numa/topology.h"

namespace kvpr {

// Pinned host memory on one NUMA node (hwloc_alloc_membind), placement verified with
// hwloc_get_area_memlocation on the first allocation; the CUDA backend registers it.
class NumaHostAllocator : public HostAllocator {
 public:
  NumaHostAllocator(std::shared_ptr<Topology> topo, int node);
  void* allocate(size_t bytes) override;
  void deallocate(void* p, size_t bytes) override;
  std::string describe() const override;
  // NUMA nodes (OS indices) that hold [p, p+bytes); the pages must have been touched.
  std::vector<int> where(const void* p, size_t bytes) const;
  size_t bytes_allocated() const { return allocated_; }

 private:
  std::shared_ptr<Topology> topo_;
  int node_;
  size_t allocated_ = 0;
};

}  // namespace kvpr

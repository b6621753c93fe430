#include "numa/numa_memory.h"

#include <hwloc.h>

#include <cstring>

#include "engine/base/error.h"

namespace kvpr {

namespace {

hwloc_topology_t H(const Topology& t) { return static_cast<hwloc_topology_t>(t.raw()); }

}  // namespace

NumaHostAllocator::NumaHostAllocator(std::shared_ptr<Topology> topo, int node) : topo_(std::move(topo)), node_(node) {}

void* NumaHostAllocator::allocate(size_t bytes) {
  hwloc_topology_t t = H(*topo_);
  void* p = nullptr;
  if (node_ >= 0) {
    hwloc_bitmap_t ns = hwloc_bitmap_alloc();
    hwloc_bitmap_set(ns, static_cast<unsigned>(node_));
    p = hwloc_alloc_membind(t, bytes, ns, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET);
    hwloc_bitmap_free(ns);
  }
  if (!p) p = hwloc_alloc(t, bytes);  // no binding possible: still page aligned
  KVPR_CHECK(p, "cannot allocate ", bytes, " bytes of host memory on NUMA node ", node_);
  std::memset(p, 0, bytes);  // touch the pages so they are placed now
  allocated_ += bytes;
  return p;
}

void NumaHostAllocator::deallocate(void* p, size_t bytes) {
  hwloc_free(H(*topo_), p, bytes);
  allocated_ -= bytes;
}

std::string NumaHostAllocator::describe() const {
  return node_ >= 0 ? "NUMA node " + std::to_string(node_) : std::string("unbound host memory");
}

std::vector<int> NumaHostAllocator::where(const void* p, size_t bytes) const {
  hwloc_bitmap_t ns = hwloc_bitmap_alloc();
  std::vector<int> out;
  if (hwloc_get_area_memlocation(H(*topo_), p, bytes, ns, HWLOC_MEMBIND_BYNODESET) == 0) {
    unsigned i;
    hwloc_bitmap_foreach_begin(i, ns) { out.push_back(static_cast<int>(i)); }
    hwloc_bitmap_foreach_end();
  }
  hwloc_bitmap_free(ns);
  return out;
}

}  // namespace kvpr

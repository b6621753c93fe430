#include "numa/topology.h"

#include <hwloc.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "engine/base/error.h"

namespace kvpr {

namespace {

std::vector<int> bits(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  if (!set) return out;
  unsigned i;
  hwloc_bitmap_foreach_begin(i, set) { out.push_back(static_cast<int>(i)); }
  hwloc_bitmap_foreach_end();
  return out;
}

}  // namespace

std::string normalize_bus_id(const std::string& id) {
  unsigned dom = 0, bus = 0, dev = 0, fn = 0;
  if (std::sscanf(id.c_str(), "%x:%x:%x.%x", &dom, &bus, &dev, &fn) == 4 ||
      (dom = 0, std::sscanf(id.c_str(), "%x:%x.%x", &bus, &dev, &fn) == 3)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", dom & 0xffff, bus, dev, fn);
    return buf;
  }
  return id;
}

Topology Topology::from_system() {
  Topology t;
  t.this_system_ = true;
  t.source_ = "this system";
  t.load();
  return t;
}

Topology Topology::from_xml(const std::string& path) {
  KVPR_CHECK(std::filesystem::exists(path), path, ": no such file");
  Topology t;
  t.source_ = path;
  hwloc_topology_t topo;
  KVPR_CHECK(hwloc_topology_init(&topo) == 0, "hwloc_topology_init failed");
  t.topo_ = topo;
  KVPR_CHECK(hwloc_topology_set_xml(topo, path.c_str()) == 0, path, ": hwloc cannot read this XML topology");
  t.load();
  return t;
}

Topology::Topology(Topology&& o) noexcept { *this = std::move(o); }
Topology& Topology::operator=(Topology&& o) noexcept {
  std::swap(topo_, o.topo_);
  this_system_ = o.this_system_;
  source_ = std::move(o.source_);
  nodes_ = std::move(o.nodes_);
  gpus_ = std::move(o.gpus_);
  return *this;
}

Topology::~Topology() {
  if (topo_) hwloc_topology_destroy(static_cast<hwloc_topology_t>(topo_));
}

void Topology::load() {
  hwloc_topology_t topo;
  if (!topo_) {
    KVPR_CHECK(hwloc_topology_init(&topo) == 0, "hwloc_topology_init failed");
    topo_ = topo;
  }
  topo = static_cast<hwloc_topology_t>(topo_);
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  KVPR_CHECK(hwloc_topology_load(topo) == 0, source_, ": hwloc could not load the topology");
  const int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    NumaNodeInfo node;
    node.os_index = static_cast<int>(o->os_index);
    node.pus = bits(o->cpuset);
    node.memory_bytes = o->attr ? o->attr->numanode.local_memory : 0;
    nodes_.push_back(std::move(node));
  }
  for (hwloc_obj_t o = hwloc_get_next_pcidev(topo, nullptr); o; o = hwloc_get_next_pcidev(topo, o)) {
    const auto& p = o->attr->pcidev;
    const unsigned cls = p.class_id >> 8;  // 0x03: display controller (VGA 0x0300, 3D 0x0302)
    if (p.vendor_id != 0x10de || cls != 0x03) continue;
    GpuInfo g;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", p.domain, p.bus, p.dev, p.func);
    g.bus_id = buf;
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, o);
    hwloc_obj_t root = hwloc_get_root_obj(topo);
    // Attached at the machine level: hwloc knows no locality (one-node machines, VMs).
    const bool whole_machine = !anc || anc == root || hwloc_bitmap_isequal(anc->cpuset, root->cpuset);
    if (!whole_machine || nodes_.size() == 1) {
      g.nodes = bits(anc ? anc->nodeset : root->nodeset);
      g.pus = bits(anc ? anc->cpuset : root->cpuset);
    }
    gpus_.push_back(std::move(g));
  }
}

std::optional<GpuInfo> Topology::find_gpu(const std::string& bus_id) const {
  const std::string want = normalize_bus_id(bus_id);
  for (const auto& g : gpus_)
    if (g.bus_id == want) return g;
  return std::nullopt;
}

}  // namespace kvpr

// The machine's shape as hwloc 2.x sees it (I/O objects kept): NUMA nodes with their cores,
// NVIDIA GPUs with their PCI bus id and locality. Loaded from this system or from an XML
// export (tests, and `lstopo --of xml` files users send us).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvpr {

struct NumaNodeInfo {
  int os_index = 0;
  std::vector<int> pus;      // OS indices of its processing units
  uint64_t memory_bytes = 0;
};

struct GpuInfo {
  std::string bus_id;        // normalised "dddd:bb:dd.f"
  std::vector<int> nodes;    // local NUMA nodes (OS indices); empty: no locality known
  std::vector<int> pus;      // local processing units; empty: no locality known
};

class Topology {
 public:
  static Topology from_system();
  static Topology from_xml(const std::string& path);  // throws kvpr::Error naming the file
  Topology(Topology&&) noexcept;
  Topology& operator=(Topology&&) noexcept;
  ~Topology();

  const std::vector<NumaNodeInfo>& nodes() const { return nodes_; }
  // NVIDIA PCI devices (vendor 0x10de, display or 3D controllers), in PCI order.
  const std::vector<GpuInfo>& gpus() const { return gpus_; }
  std::optional<GpuInfo> find_gpu(const std::string& bus_id) const;
  bool is_this_system() const { return this_system_; }
  std::string source() const { return source_; }
  void* raw() const { return topo_; }  // hwloc_topology_t

 private:
  Topology() = default;
  void load();
  void* topo_ = nullptr;
  bool this_system_ = false;
  std::string source_;
  std::vector<NumaNodeInfo> nodes_;
  std::vector<GpuInfo> gpus_;
};

// "0000:17:00.0", "00000000:17:00.0" and "17:00.0" all become "0000:17:00.0".
std::string normalize_bus_id(const std::string& id);

}  // namespace kvpr

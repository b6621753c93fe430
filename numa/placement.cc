#include "numa/placement.h"

#include <hwloc.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>

#include "engine/base/error.h"

namespace kvpr {

namespace {

hwloc_topology_t H(const Topology& t) { return static_cast<hwloc_topology_t>(t.raw()); }

}  // namespace

std::string cpu_list(const std::vector<int>& cpus) {
  std::vector<int> c = cpus;
  std::sort(c.begin(), c.end());
  std::string out;
  for (size_t i = 0; i < c.size();) {
    size_t j = i;
    while (j + 1 < c.size() && c[j + 1] == c[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(c[i]);
    if (j > i) out += "-" + std::to_string(c[j]);
    i = j + 1;
  }
  return out.empty() ? "-" : out;
}

std::vector<int> parse_cpu_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part.empty() || part == "-") continue;
    size_t dash = part.find('-');
    try {
      int a = std::stoi(part.substr(0, dash));
      int b = dash == std::string::npos ? a : std::stoi(part.substr(dash + 1));
      KVPR_CHECK(a >= 0 && b >= a && b < 1 << 20, "bad cpu range '", part, "'");
      for (int i = a; i <= b; ++i) out.push_back(i);
    } catch (const std::invalid_argument&) {
      KVPR_THROW("bad cpu list '", s, "'");
    }
  }
  return out;
}

std::vector<WorkerPlacement> plan_placement(const Topology& topo, const std::vector<std::string>& gpu_bus_ids,
                                            int cpu_workers) {
  std::vector<WorkerPlacement> plan;
  const auto& nodes = topo.nodes();
  std::map<int, int> load;  // node -> workers placed
  for (const auto& n : nodes) load[n.os_index] = 0;
  auto least_loaded = [&]() {
    int best = -1;
    for (const auto& n : nodes)
      if (best < 0 || load[n.os_index] < load[best]) best = n.os_index;
    return best;
  };
  if (!gpu_bus_ids.empty()) {
    // First the GPUs whose locality is known, then the others on the least loaded nodes.
    for (size_t i = 0; i < gpu_bus_ids.size(); ++i) {
      WorkerPlacement p;
      p.worker = static_cast<int>(i);
      if (gpu_bus_ids[i].empty()) {  // kvpr-bench scale's stand-in for a GPU this host lacks
        p.note = "no GPU: a neighbour's load";
        plan.push_back(p);
        continue;
      }
      p.cuda_device = static_cast<int>(i);
      p.gpu_bus_id = normalize_bus_id(gpu_bus_ids[i]);
      auto g = topo.find_gpu(p.gpu_bus_id);
      if (g && !g->nodes.empty()) {
        p.gpu_has_locality = true;
        p.numa_node = g->nodes.front();
        if (g->nodes.size() > 1) p.note = "GPU local to several nodes; using the first";
        ++load[p.numa_node];
      } else {
        p.note = g ? "GPU has no NUMA locality" : "GPU not in the topology";
      }
      plan.push_back(p);
    }
    for (auto& p : plan)
      if (p.numa_node < 0 && !nodes.empty()) {
        p.numa_node = least_loaded();
        ++load[p.numa_node];
        p.note += "; spread to node " + std::to_string(p.numa_node);
      }
  } else {
    for (int i = 0; i < cpu_workers; ++i) {
      WorkerPlacement p;
      p.worker = i;
      if (!nodes.empty()) {
        p.numa_node = least_loaded();
        ++load[p.numa_node];
      }
      plan.push_back(p);
    }
  }
  // Cores: each node's PUs split into contiguous, disjoint shares among its workers.
  std::map<int, std::vector<WorkerPlacement*>> on_node;
  for (auto& p : plan) on_node[p.numa_node].push_back(&p);
  for (auto& [node, ws] : on_node) {
    std::vector<int> pus;
    if (node >= 0) {
      for (const auto& n : nodes)
        if (n.os_index == node) pus = n.pus;
    }
    if (pus.empty()) continue;  // no NUMA information: no CPU binding
    const size_t k = ws.size();
    if (pus.size() < k) {
      for (size_t i = 0; i < k; ++i) {
        ws[i]->cpus = {pus[i % pus.size()]};
        ws[i]->note += std::string(ws[i]->note.empty() ? "" : "; ") + "fewer cores than workers on the node: shared";
      }
      continue;
    }
    for (size_t i = 0; i < k; ++i) {
      size_t b = i * pus.size() / k, e = (i + 1) * pus.size() / k;
      ws[i]->cpus.assign(pus.begin() + static_cast<std::ptrdiff_t>(b), pus.begin() + static_cast<std::ptrdiff_t>(e));
    }
  }
  return plan;
}

std::string placement_table(const Topology& topo, const std::vector<WorkerPlacement>& plan) {
  std::ostringstream o;
  o << "topology: " << topo.source() << ", " << topo.nodes().size() << " NUMA node(s), " << topo.gpus().size()
    << " NVIDIA GPU(s)\n";
  for (const auto& n : topo.nodes())
    o << "  node " << n.os_index << ": cpus " << cpu_list(n.pus) << ", " << (n.memory_bytes >> 20) << " MiB\n";
  o << "worker  gpu  bus id        node  cpus            note\n";
  for (const auto& p : plan) {
    char line[256];
    std::snprintf(line, sizeof line, "%-7d %-4s %-13s %-5s %-15s %s\n", p.worker,
                  p.cuda_device >= 0 ? std::to_string(p.cuda_device).c_str() : "cpu",
                  p.gpu_bus_id.empty() ? "-" : p.gpu_bus_id.c_str(),
                  p.numa_node >= 0 ? std::to_string(p.numa_node).c_str() : "-", cpu_list(p.cpus).c_str(),
                  p.note.c_str());
    o << line;
  }
  return o.str();
}

json::Value placement_json(const Topology& topo, const std::vector<WorkerPlacement>& plan) {
  json::Value v(json::Object{});
  v.set("source", topo.source());
  json::Array nodes;
  for (const auto& n : topo.nodes()) {
    json::Value j(json::Object{});
    j.set("node", n.os_index);
    j.set("cpus", cpu_list(n.pus));
    j.set("memory_bytes", static_cast<int64_t>(n.memory_bytes));
    nodes.push_back(std::move(j));
  }
  v.set("nodes", std::move(nodes));
  json::Array gpus;
  for (const auto& g : topo.gpus()) {
    json::Value j(json::Object{});
    j.set("bus_id", g.bus_id);
    json::Array ns;
    for (int n : g.nodes) ns.emplace_back(n);
    j.set("nodes", std::move(ns));
    gpus.push_back(std::move(j));
  }
  v.set("gpus", std::move(gpus));
  json::Array ws;
  for (const auto& p : plan) {
    json::Value j(json::Object{});
    j.set("worker", p.worker);
    j.set("cuda_device", p.cuda_device);
    j.set("gpu_bus_id", p.gpu_bus_id);
    j.set("numa_node", p.numa_node);
    j.set("cpus", cpu_list(p.cpus));
    j.set("gpu_has_locality", p.gpu_has_locality);
    j.set("note", p.note);
    ws.push_back(std::move(j));
  }
  v.set("workers", std::move(ws));
  return v;
}

std::string bind_this_process(const Topology& topo, const WorkerPlacement& p) {
  KVPR_CHECK(topo.is_this_system(), "cannot bind to a topology loaded from ", topo.source());
  hwloc_topology_t t = H(topo);
  std::string what;
  if (!p.cpus.empty()) {
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    for (int c : p.cpus) hwloc_bitmap_set(set, static_cast<unsigned>(c));
    int r = hwloc_set_cpubind(t, set, HWLOC_CPUBIND_PROCESS);
    hwloc_bitmap_free(set);
    KVPR_CHECK(r == 0, "cannot bind to cpus ", cpu_list(p.cpus), ": ", std::strerror(errno));
    what += "cpus " + cpu_list(p.cpus);
  }
  if (p.numa_node >= 0) {
    hwloc_bitmap_t ns = hwloc_bitmap_alloc();
    hwloc_bitmap_set(ns, static_cast<unsigned>(p.numa_node));
    int r = hwloc_set_membind(t, ns, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_PROCESS | HWLOC_MEMBIND_BYNODESET);
    hwloc_bitmap_free(ns);
    // A single-node machine or a kernel without NUMA may refuse a membind; CPU binding stays.
    what += (what.empty() ? "" : ", ") + std::string(r == 0 ? "memory on node " : "memory binding unsupported (node ") +
            std::to_string(p.numa_node) + (r == 0 ? "" : ")");
  }
  return what.empty() ? "not bound (no NUMA information)" : what;
}

}  // namespace kvpr

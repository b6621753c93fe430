// Where each worker runs: its GPU, its NUMA node, a cpuset disjoint from the other workers'
// (and, for cpu-attn, the host attention threads taken from it), and where its host memory
// (the KV store, pinned staging) lives. Computed by the controller, applied by each worker
// to itself before it allocates (its NUMA-local memory: numa_memory.h).
#pragma once

#include <string>
#include <vector>

#include "engine/base/json.h"
#include "numa/topology.h"

namespace kvpr {

struct WorkerPlacement {
  int worker = 0;
  int cuda_device = -1;       // -1: a CPU worker
  std::string gpu_bus_id;
  int numa_node = -1;         // OS index; -1: no binding (no NUMA information)
  std::vector<int> cpus;      // PU OS indices for the worker (disjoint across workers when possible)
  bool gpu_has_locality = false;
  std::string note;           // why the plan is what it is, for the table
};

// GPU workers: one per bus id (CUDA order); an empty bus id is a worker placed like a GPU with
// no known locality (kvpr-bench scale's neighbour standing in for a GPU this host lacks).
// CPU workers: `cpu_workers` of them.
std::vector<WorkerPlacement> plan_placement(const Topology& topo, const std::vector<std::string>& gpu_bus_ids,
                                            int cpu_workers);

std::string placement_table(const Topology& topo, const std::vector<WorkerPlacement>& plan);
json::Value placement_json(const Topology& topo, const std::vector<WorkerPlacement>& plan);

// "0-3,8,10-11"
std::string cpu_list(const std::vector<int>& cpus);
std::vector<int> parse_cpu_list(const std::string& s);

// Binds the calling process's CPUs and memory policy to the placement (this system only).
// Returns a one-line description of what was done.
std::string bind_this_process(const Topology& topo, const WorkerPlacement& p);

}  // namespace kvpr

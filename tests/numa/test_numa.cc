// NUMA placement: topologies from XML fixtures and from this machine, plans for GPU and
// CPU workers, binding a process, and NUMA-local allocation.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/base/error.h"
#include "numa/numa_memory.h"
#include "numa/placement.h"
#include "tests/test_util.h"

using namespace kvpr;

namespace {

Topology xml(const std::string& name) { return Topology::from_xml(test::data_path("hwloc/" + name)); }

void expect_disjoint(const std::vector<WorkerPlacement>& plan) {
  std::set<int> seen;
  for (const auto& p : plan)
    for (int c : p.cpus) EXPECT_TRUE(seen.insert(c).second) << "cpu " << c << " given twice";
}

}  // namespace

TEST(Numa, TwoSocketsTwoGpusEachOnItsNode) {
  Topology t = xml("two-socket-two-gpu.xml");
  ASSERT_EQ(t.nodes().size(), 2u);
  ASSERT_EQ(t.gpus().size(), 2u);
  EXPECT_EQ(t.gpus()[0].bus_id, "0000:17:00.0");
  EXPECT_EQ(t.gpus()[0].nodes, std::vector<int>{0});
  EXPECT_EQ(t.gpus()[1].nodes, std::vector<int>{1});
  // CUDA may enumerate in another order and spell the domain with 8 digits.
  auto plan = plan_placement(t, {"00000000:65:00.0", "0000:17:00.0"}, 0);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].numa_node, 1);
  EXPECT_EQ(plan[0].cpus, (std::vector<int>{2, 3}));
  EXPECT_EQ(plan[1].numa_node, 0);
  EXPECT_EQ(plan[1].cpus, (std::vector<int>{0, 1}));
  EXPECT_TRUE(plan[0].gpu_has_locality);
  std::string table = placement_table(t, plan);
  EXPECT_NE(table.find("0000:65:00.0  1     2-3"), std::string::npos) << table;
  json::Value j = placement_json(t, plan);
  EXPECT_EQ(j.find("workers")->as_array()[1].find("cpus")->as_string(), "0-1");
}

TEST(Numa, FourGpusOnTwoSocketsShareEachNodeDisjointly) {
  Topology t = xml("four-gpu-two-socket.xml");
  ASSERT_EQ(t.gpus().size(), 4u);
  auto plan = plan_placement(t, {"0000:17:00.0", "0000:31:00.0", "0000:65:00.0", "0000:ca:00.0"}, 0);
  EXPECT_EQ(plan[0].numa_node, 0);
  EXPECT_EQ(plan[1].numa_node, 0);
  EXPECT_EQ(plan[2].numa_node, 1);
  EXPECT_EQ(plan[3].numa_node, 1);
  EXPECT_EQ(plan[0].cpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(plan[1].cpus, (std::vector<int>{2, 3}));
  EXPECT_EQ(plan[3].cpus, (std::vector<int>{6, 7}));
  expect_disjoint(plan);
}

TEST(Numa, GpusWithoutLocalityAreSpreadAcrossNodes) {
  Topology t = xml("gpus-without-locality.xml");
  ASSERT_EQ(t.gpus().size(), 2u);
  EXPECT_TRUE(t.gpus()[0].nodes.empty());
  auto plan = plan_placement(t, {"0000:3b:00.0", "0000:5e:00.0"}, 0);
  EXPECT_FALSE(plan[0].gpu_has_locality);
  EXPECT_NE(plan[0].numa_node, plan[1].numa_node);  // spread, not piled on node 0
  EXPECT_NE(plan[0].note.find("no NUMA locality"), std::string::npos);
  expect_disjoint(plan);
}

TEST(Numa, MoreGpusThanNodes) {
  Topology t = xml("more-gpus-than-nodes.xml");
  auto plan = plan_placement(t, {"0000:17:00.0", "0000:31:00.0", "0000:65:00.0"}, 0);
  EXPECT_EQ(plan[0].numa_node, 0);
  EXPECT_EQ(plan[1].numa_node, 0);
  EXPECT_EQ(plan[2].numa_node, 1);
  EXPECT_EQ(plan[0].cpus, std::vector<int>{0});
  EXPECT_EQ(plan[1].cpus, std::vector<int>{1});
  EXPECT_EQ(plan[2].cpus, (std::vector<int>{2, 3}));
  expect_disjoint(plan);
  // A GPU the topology does not know still gets a node.
  auto odd = plan_placement(t, {"0000:99:00.0"}, 0);
  EXPECT_GE(odd[0].numa_node, 0);
  EXPECT_NE(odd[0].note.find("not in the topology"), std::string::npos);
}

TEST(Numa, OneNodeOneGpuAndCpuWorkers) {
  Topology t = xml("one-node-one-gpu.xml");
  ASSERT_EQ(t.gpus().size(), 1u);
  EXPECT_EQ(t.gpus()[0].nodes, std::vector<int>{0});  // one node: local by definition
  auto plan = plan_placement(t, {"0000:01:00.0"}, 0);
  EXPECT_EQ(plan[0].cpus, (std::vector<int>{0, 1, 2, 3}));
  auto cpu = plan_placement(t, {}, 3);  // CPU workers share the node's cores disjointly
  ASSERT_EQ(cpu.size(), 3u);
  EXPECT_EQ(cpu[0].cpus, std::vector<int>{0});
  EXPECT_EQ(cpu[2].cpus, (std::vector<int>{2, 3}));
  expect_disjoint(cpu);
  auto many = plan_placement(t, {}, 6);  // more workers than cores: shared, and said so
  EXPECT_NE(many[5].note.find("shared"), std::string::npos);
}

TEST(Numa, CpuListsRoundTrip) {
  EXPECT_EQ(cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(cpu_list({}), "-");
  EXPECT_THROW(parse_cpu_list("3-1"), Error);
  EXPECT_THROW(Topology::from_xml(test::data_path("hwloc/nope.xml")), Error);
}

TEST(Numa, ThisMachinePlansBindsAndAllocatesLocally) {
  auto t = std::make_shared<Topology>(Topology::from_system());
  ASSERT_GE(t->nodes().size(), 1u);
  auto plan = plan_placement(*t, {}, 2);
  ASSERT_EQ(plan.size(), 2u);
  expect_disjoint(plan);
  // Bind a child process (so this test process keeps its affinity) and check it took.
  pid_t pid = fork();
  if (pid == 0) {
    std::string what = bind_this_process(*t, plan[1]);
    cpu_set_t set;
    CPU_ZERO(&set);
    sched_getaffinity(0, sizeof set, &set);
    int n = 0;
    bool ok = true;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) {
        ++n;
        ok = ok && std::find(plan[1].cpus.begin(), plan[1].cpus.end(), c) != plan[1].cpus.end();
      }
    _exit(ok && n == static_cast<int>(plan[1].cpus.size()) ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // NUMA-local pinned memory through the backend: the KV store lands on the worker's node.
  auto alloc = std::make_shared<NumaHostAllocator>(t, plan[0].numa_node);
  CpuBackend be;
  be.set_host_allocator(alloc);
  Tensor kv = be.alloc_pinned(DType::F16, {1024, 1024});
  EXPECT_EQ(kv.memory(), MemoryKind::PinnedHost);
  EXPECT_EQ(alloc->bytes_allocated(), kv.nbytes());
  std::vector<int> where = alloc->where(kv.data(), kv.nbytes());
  ASSERT_FALSE(where.empty());
  EXPECT_EQ(where, std::vector<int>{plan[0].numa_node});
  kv = Tensor();
  EXPECT_EQ(alloc->bytes_allocated(), 0u);
}

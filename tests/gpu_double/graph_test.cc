// Graphs built node by node: structure queries with CUDA's list conventions, execution in
// dependency order, edits, clones and executable-graph updates. These run against the real
// driver too (real_driver_check.sh), except where tagged [double_only].
#include <algorithm>
#include <set>
#include <vector>

#include "test_support.h"

using namespace ivcuda::gpu_double::test;

namespace {

CUDA_MEMSET_NODE_PARAMS memset32(CUdeviceptr d, unsigned v, size_t n) {
  CUDA_MEMSET_NODE_PARAMS m{};
  m.dst = d;
  m.value = v;
  m.elementSize = 4;
  m.width = n;
  m.height = 1;
  return m;
}

CUDA_MEMCPY3D d2d(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = src;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = dst;
  c.WidthInBytes = bytes;
  c.Height = 1;
  c.Depth = 1;
  return c;
}

std::vector<unsigned> read(CUdeviceptr d, size_t n) {
  std::vector<unsigned> v(n);
  REQUIRE(cuMemcpyDtoH(v.data(), d, n * 4) == CUDA_SUCCESS);
  return v;
}

}  // namespace

TEST_CASE("graph lists follow CUDA's conventions", "[gpu_double][graph]") {
  ScopedContext ctx;
  CUgraph g = nullptr;
  CU_REQUIRE(cuGraphCreate(&g, 0));
  CUgraphNode a = nullptr, b = nullptr, c = nullptr;
  CU_REQUIRE(cuGraphAddEmptyNode(&a, g, nullptr, 0));
  CU_REQUIRE(cuGraphAddEmptyNode(&b, g, &a, 1));
  const CUgraphNode ab[] = {a, b};
  CU_REQUIRE(cuGraphAddEmptyNode(&c, g, ab, 2));

  size_t n = 0;
  CU_REQUIRE(cuGraphGetNodes(g, nullptr, &n));
  CHECK(n == 3);
  std::vector<CUgraphNode> big(5, reinterpret_cast<CUgraphNode>(1));
  n = big.size();
  CU_REQUIRE(cuGraphGetNodes(g, big.data(), &n));
  CHECK(n == 3);
  CHECK(big[3] == nullptr);
  CHECK(big[4] == nullptr);
  CHECK(std::set<CUgraphNode>(big.begin(), big.begin() + 3) == std::set<CUgraphNode>{a, b, c});

  n = 0;
  CU_REQUIRE(cuGraphGetRootNodes(g, nullptr, &n));
  CHECK(n == 1);
  n = 0;
  CU_REQUIRE(cuGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
  CHECK(n == 3);
  std::vector<CUgraphNode> from(n), to(n);
  CU_REQUIRE(cuGraphGetEdges(g, from.data(), to.data(), nullptr, &n));
  std::set<std::pair<CUgraphNode, CUgraphNode>> edges;
  for (size_t i = 0; i < n; ++i) edges.emplace(from[i], to[i]);
  CHECK(edges == std::set<std::pair<CUgraphNode, CUgraphNode>>{{a, b}, {a, c}, {b, c}});
  n = 0;
  CU_REQUIRE(cuGraphNodeGetDependentNodes(a, nullptr, nullptr, &n));
  CHECK(n == 2);
  CU_REQUIRE_ERR(cuGraphGetNodes(g, nullptr, nullptr), CUDA_ERROR_INVALID_VALUE);

  // Removing an edge, then the node in the middle, takes their edges along.
  CU_REQUIRE(cuGraphRemoveDependencies(g, &a, &c, nullptr, 1));
  CU_REQUIRE_ERR(cuGraphRemoveDependencies(g, &a, &c, nullptr, 1), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuGraphDestroyNode(b));
  n = 0;
  CU_REQUIRE(cuGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
  CHECK(n == 0);
  n = 0;
  CU_REQUIRE(cuGraphGetRootNodes(g, nullptr, &n));
  CHECK(n == 2);
  CU_REQUIRE(cuGraphDestroy(g));
}

TEST_CASE("nodes run in dependency order, launch after launch", "[gpu_double][graph]") {
  ScopedContext ctx;
  constexpr size_t kN = 1024;
  CUdeviceptr x = 0, y = 0;
  CU_REQUIRE(cuMemAlloc(&x, kN * 4));
  CU_REQUIRE(cuMemAlloc(&y, kN * 4));
  CUgraph g = nullptr;
  CU_REQUIRE(cuGraphCreate(&g, 0));
  // Created in the opposite order to the one they must run in: y = x after x = 7.
  CUgraphNode copy = nullptr, set = nullptr;
  CUDA_MEMCPY3D cp = d2d(y, x, kN * 4);
  CU_REQUIRE(cuGraphAddMemcpyNode(&copy, g, nullptr, 0, &cp, ctx.get()));
  CUDA_MEMSET_NODE_PARAMS ms = memset32(x, 7, kN);
  CU_REQUIRE(cuGraphAddMemsetNode(&set, g, nullptr, 0, &ms, ctx.get()));
  CU_REQUIRE(cuGraphAddDependencies(g, &set, &copy, nullptr, 1));
  CUgraphExec e = nullptr;
  CU_REQUIRE(cuGraphInstantiateWithFlags(&e, g, 0));
  for (int i = 0; i < 3; ++i) {
    CU_REQUIRE(cuMemsetD32(y, 0, kN));
    CU_REQUIRE(cuGraphLaunch(e, nullptr));
    CU_REQUIRE(cuCtxSynchronize());
    const auto v = read(y, kN);
    CHECK(std::all_of(v.begin(), v.end(), [](unsigned u) { return u == 7; }));
  }

  // The executable graph's memset changed; the graph keeps its own.
  CUDA_MEMSET_NODE_PARAMS ms9 = memset32(x, 9, kN);
  CU_REQUIRE(cuGraphExecMemsetNodeSetParams(e, set, &ms9, ctx.get()));
  CU_REQUIRE(cuGraphLaunch(e, nullptr));
  CU_REQUIRE(cuCtxSynchronize());
  auto v = read(y, kN);
  CHECK(v[0] == 9);
  CUDA_MEMSET_NODE_PARAMS got{};
  CU_REQUIRE(cuGraphMemsetNodeGetParams(set, &got));
  CHECK(got.value == 7);

  // An update from a clone with another value; then one with another shape fails.
  CUgraph cl = nullptr;
  CU_REQUIRE(cuGraphClone(&cl, g));
  CUgraphNode set_clone = nullptr;
  CU_REQUIRE(cuGraphNodeFindInClone(&set_clone, set, cl));
  CUDA_MEMSET_NODE_PARAMS ms5 = memset32(x, 5, kN);
  CU_REQUIRE(cuGraphMemsetNodeSetParams(set_clone, &ms5));
  CUgraphExecUpdateResultInfo info{};
  CU_REQUIRE(cuGraphExecUpdate(e, cl, &info));
  CHECK(info.result == CU_GRAPH_EXEC_UPDATE_SUCCESS);
  CU_REQUIRE(cuGraphLaunch(e, nullptr));
  CU_REQUIRE(cuCtxSynchronize());
  v = read(y, kN);
  CHECK(v[0] == 5);
  CUgraphNode extra = nullptr;
  CU_REQUIRE(cuGraphAddEmptyNode(&extra, cl, nullptr, 0));
  CU_REQUIRE_ERR(cuGraphExecUpdate(e, cl, &info), CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
  CHECK(info.result == CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED);

  // A disabled node does not run.
  CU_REQUIRE(cuMemsetD32(y, 0, kN));
  CU_REQUIRE(cuGraphNodeSetEnabled(e, copy, 0));
  CU_REQUIRE(cuGraphLaunch(e, nullptr));
  CU_REQUIRE(cuCtxSynchronize());
  v = read(y, kN);
  CHECK(v[0] == 0);

  CU_REQUIRE(cuGraphExecDestroy(e));
  CU_REQUIRE(cuGraphDestroy(cl));
  CU_REQUIRE(cuGraphDestroy(g));
  CU_REQUIRE(cuMemFree(x));
  CU_REQUIRE(cuMemFree(y));
}

TEST_CASE("edges must join distinct nodes of the graph", "[gpu_double][graph]") {
  ScopedContext ctx;
  CUgraph g = nullptr, other = nullptr;
  CU_REQUIRE(cuGraphCreate(&g, 0));
  CU_REQUIRE(cuGraphCreate(&other, 0));
  CUgraphNode a = nullptr, b = nullptr, foreign = nullptr;
  CU_REQUIRE(cuGraphAddEmptyNode(&a, g, nullptr, 0));
  CU_REQUIRE(cuGraphAddEmptyNode(&b, g, &a, 1));
  CU_REQUIRE(cuGraphAddEmptyNode(&foreign, other, nullptr, 0));
  CU_REQUIRE_ERR(cuGraphAddDependencies(g, &foreign, &b, nullptr, 1), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuGraphAddEmptyNode(&b, g, &foreign, 1), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuGraphDestroy(other));
  CU_REQUIRE(cuGraphDestroy(g));
}

TEST_CASE("a cycle does not instantiate", "[gpu_double][graph][double_only]") {
  ScopedContext ctx;
  CUgraph g = nullptr;
  CU_REQUIRE(cuGraphCreate(&g, 0));
  CUgraphNode a = nullptr, b = nullptr;
  CU_REQUIRE(cuGraphAddEmptyNode(&a, g, nullptr, 0));
  CU_REQUIRE(cuGraphAddEmptyNode(&b, g, &a, 1));
  CU_REQUIRE(cuGraphAddDependencies(g, &b, &a, nullptr, 1));
  CUgraphExec e = nullptr;
  CU_REQUIRE_ERR(cuGraphInstantiateWithFlags(&e, g, 0), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuGraphDestroy(g));
}

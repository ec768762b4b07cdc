// What the fuzzer's seeds turned up in the worker (tests/fuzz/op_seeds.py), as hostile-guest
// checks against the daemon: each sends what no well-behaved libcuda would, and the worker
// must refuse it and keep serving.
#include <catch2/catch.hpp>

#include <cuda.h>

#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "ivcuda/proto.h"
#include "tests/process/raw_guest.h"

using namespace ivcuda;
using namespace ivcuda::testing;
using proto::Op;

namespace {

const char kPtx[] = ".version 8.0\n.target sm_90\n.address_size 64\n"
                    ".visible .entry ivc_inc_u32(.param .u64 p)\n{\nret;\n}\n";

// A function of a module loaded in device 0's primary context, which `ctx` receives.
std::uint64_t a_function(RawGuest& g, std::uint64_t* ctx) {
  std::vector<std::byte> out;
  REQUIRE(g.call(0, Op::kHello, proto::ReqHello{proto::kProtoVersion, 1, 0, 0, {}}) == CUDA_SUCCESS);
  REQUIRE(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  *ctx = RawGuest::as<proto::RepHandle>(out).handle;
  std::memcpy(g.bar.data() + g.l.arena_off, kPtx, sizeof kPtx - 1);
  REQUIRE(g.call(0, Op::kModuleLoad, proto::ReqModuleLoad{*ctx, sizeof kPtx - 1, g.l.arena_off, 0, 0}, &out) ==
          CUDA_SUCCESS);
  const auto module = RawGuest::as<proto::RepHandle>(out).handle;
  const std::string name = "ivc_inc_u32";
  proto::ReqModuleName mn{*ctx, module, static_cast<std::uint32_t>(name.size()), 0};
  REQUIRE(g.call(0, Op::kModuleGetFunction, mn, &out, std::as_bytes(std::span(name))) == CUDA_SUCCESS);
  return RawGuest::as<proto::RepFunction>(out).function;
}

}  // namespace

// A number cast to a CUDA enum type outside the enum's range is undefined behaviour in the
// worker (UBSan's enum check stops the worker of the sanitizer builds at its first use), so
// every guest number that becomes one passes wire_enum() first. cuFuncGetAttribute's
// attribute and cuMemGetAllocationGranularity's option did not.
TEST_CASE("guest numbers outside a CUDA enum's range never become one", "[process][hostile]") {
  Daemon d;
  RawGuest g(d.sock);
  g.open(0);
  std::uint64_t ctx = 0;
  const std::uint64_t fn = a_function(g, &ctx);
  // As an int: a worker that died answers nothing, and RawGuest's "no reply" is no CUresult.
  const auto call = [&](Op op, const auto& req) { return static_cast<int>(g.call(0, op, req)); };

  proto::ReqFuncAttr attr{ctx, fn, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 0};
  CHECK(call(Op::kFuncGetAttribute, attr) == CUDA_SUCCESS);
  for (const std::int32_t bad : {1 << 20, -1}) {
    attr.attrib = bad;
    REQUIRE(call(Op::kFuncGetAttribute, attr) == CUDA_ERROR_INVALID_VALUE);
  }

  proto::ReqMemGranularity gran{};
  gran.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  gran.prop.loc_type = CU_MEM_LOCATION_TYPE_DEVICE;
  gran.option = CU_MEM_ALLOC_GRANULARITY_RECOMMENDED;
  CHECK(call(Op::kMemGranularity, gran) == CUDA_SUCCESS);
  gran.option = 2;  // CUmemAllocationGranularity_flags holds 0 and 1
  CHECK(call(Op::kMemGranularity, gran) == CUDA_ERROR_INVALID_VALUE);

  // The other sites as well: a cache configuration and a limit.
  CHECK(call(Op::kFuncSetCacheConfig, proto::ReqFuncCache{ctx, fn, 9, 0}) == CUDA_ERROR_INVALID_VALUE);
  CHECK(call(Op::kCtxGetLimit, proto::ReqLimit{ctx, 0, 0x7fff, 0}) == CUDA_ERROR_INVALID_VALUE);

  // And the worker serves on.
  CHECK(call(Op::kCtxSynchronize, proto::ReqCtx{ctx}) == CUDA_SUCCESS);
  CHECK(d.alive());
}

// ivcudad's command line (host-daemon/daemon/options.h), parsed as the daemon
// and a reload parse it: defaults, sizes, the compound values of
// --guest-socket, --gpus and --object-limits, and the refusals that name why.
#include "host-daemon/daemon/options.h"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace ivcuda::host;

namespace {
// Parses `args` (after the program's name) into fresh Options; "" or the error.
std::string parse(std::vector<std::string> args, Options* o) {
  args.insert(args.begin(), "ivcudad");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_options(static_cast<int>(argv.size()), argv.data(), o);
}
}  // namespace

TEST_CASE("ivcudad's defaults are the README's", "[host][options]") {
  Options o;
  REQUIRE(parse({}, &o).empty());
  CHECK(o.socket == "/run/ivcuda/ivcudad.sock");
  CHECK(o.shm_size == (1ull << 30));
  CHECK(o.channels == 32);
  CHECK(o.warm_workers == 1);
  CHECK(o.warm_burst == 4);
  CHECK(o.recycle == "keep");
  CHECK(o.wait_for_ready == "off");
  CHECK(o.context_turns == "off");
  CHECK(o.pin_arena == "on-use");
  CHECK(o.sandbox_mode == "on");
  CHECK(o.context_reserve == kDefaultContextReserve);
}

TEST_CASE("sizes, lists and object limits parse as documented", "[host][options]") {
  Options o;
  REQUIRE(parse({"--shm-size", "2G", "--mem-limit", "512M", "--object-limits", "streams=10,green-contexts=3",
                 "--guest-socket", "/tmp/a.sock=1", "--guest-socket", "/tmp/b.sock=0,1:mem-limit=1G"},
                &o)
              .empty());
  CHECK(o.shm_size == (2ull << 30));
  CHECK(o.mem_limit == (512ull << 20));
  CHECK(o.limits.streams == 10);
  CHECK(o.limits.green_contexts == 3);
  CHECK(o.limits.events == ObjectLimits{}.events);
  CHECK(o.guest_sockets.size() == 2);
}

TEST_CASE("bad values are refused with the reason", "[host][options]") {
  Options o;
  CHECK_THAT(parse({"--object-limits", "widgets=3"}, &o), Catch::Contains("unknown kind 'widgets'"));
  CHECK_THAT(parse({"--object-limits", "streams=0"}, &o), Catch::Contains("expected streams=N"));
  CHECK_FALSE(parse({"--pin-arena", "sometimes"}, &o).empty());
  CHECK_FALSE(parse({"--wait-for-ready", "maybe"}, &o).empty());
  CHECK_FALSE(parse({"--context-turns", "sometimes"}, &o).empty());
  CHECK(parse({"--context-turns", "made"}, &o).empty());  // contexts in turns, resets as they come
  CHECK(parse({"--sandbox", "audit"}, &o).empty());  // what the allowlist lacks is made and logged
  CHECK(o.sandbox_mode == "audit");
  CHECK_FALSE(parse({"--sandbox", "loose"}, &o).empty());
  CHECK(o.context_turns == "made");
  CHECK_FALSE(parse({"--warm-workers", "9"}, &o).empty());
  CHECK_FALSE(parse({"--socket-mode", "999"}, &o).empty());
}

TEST_CASE("a --guest-socket entry: GPUs, quota, share, warm workers, huge pages", "[host][options]") {
  SocketSpec s;
  std::string err;
  REQUIRE(parse_socket_spec("/run/x.sock=0,2:mem-limit=20G:compute=50:warm=2:huge-pages=on", 0, 100, 1, false, &s,
                            &err));
  CHECK(s.path == "/run/x.sock");
  CHECK(s.gpus == std::vector<int>{0, 2});
  CHECK(s.mem_limit == (20ull << 30));
  CHECK(s.compute == 50);
  CHECK(s.warm == 2);
  CHECK(s.huge);
  REQUIRE(parse_socket_spec("/run/y.sock=all", 7, 30, 0, true, &s, &err));
  CHECK(s.gpus.empty());
  CHECK(s.mem_limit == 7);  // the daemon's defaults where the entry says nothing
  CHECK(s.compute == 30);
  CHECK(s.warm == 0);
  CHECK(s.huge);
  CHECK_FALSE(parse_socket_spec("/run/z.sock", 0, 100, 1, false, &s, &err));
  CHECK(err == "no SOCKET=GPUS");
  err.clear();
  CHECK_FALSE(parse_socket_spec("/run/z.sock=0:compute=0", 0, 100, 1, false, &s, &err));
  CHECK_THAT(err, Catch::Contains("percentage"));
  err.clear();
  CHECK_FALSE(parse_socket_spec("/run/z.sock=0:colour=red", 0, 100, 1, false, &s, &err));
  CHECK_THAT(err, Catch::Contains("unknown setting"));
}

TEST_CASE("the GPU list (--gpus): all, a list, or a clear refusal", "[host][options]") {
  std::string err;
  CHECK(parse_gpus("all", &err).empty());
  CHECK(parse_gpus("1,3", &err) == std::vector<int>{1, 3});
  CHECK(err.empty());
  CHECK(parse_gpus("1,x", &err).empty());
  CHECK_THAT(err, Catch::Contains("bad GPU index 'x'"));
}

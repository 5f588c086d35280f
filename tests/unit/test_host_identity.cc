#include <doctest/doctest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lib/launch/local_host.h"
#include "lib/launch/planning/host_identity.h"
#include "lib/launch/planning/host_merge.h"

namespace perseus::launch {
namespace {

HostSpec mention(std::string host, std::optional<int> slots, std::string origin = "-H",
                 std::string user = "") {
  return HostSpec{std::move(user), std::move(host), slots, std::nullopt, std::move(origin)};
}

// A resolver that knows a few names, and counts how often each is asked.
struct FakeResolver {
  std::map<std::string, HostAddresses> names;
  std::map<std::string, int> asked;

  ResolveHost resolver() {
    return [this](const std::string &host) {
      ++asked[host];
      const auto it = names.find(host);
      return it == names.end() ? HostAddresses{} : it->second;
    };
  }
};

FakeResolver fake() {
  FakeResolver f;
  f.names["localhost"] = {true, {"127.0.0.1", "::1"}};
  f.names["127.0.0.1"] = {true, {"127.0.0.1"}};
  f.names["::1"] = {true, {"::1"}};
  f.names["me"] = {true, {"10.0.0.5"}};
  f.names["10.0.0.5"] = {true, {"10.0.0.5"}};
  f.names["node1"] = {false, {"10.0.0.1"}};
  f.names["node1.example"] = {false, {"10.0.0.1"}};
  f.names["10.0.0.1"] = {false, {"10.0.0.1"}};
  f.names["node2"] = {false, {"10.0.0.2", "fd00::2"}};
  f.names["fd00::2"] = {false, {"fd00::2"}};
  return f;
}

std::vector<std::string> names_of(const std::vector<HostSpec> &mentions) {
  std::vector<std::string> names;
  for (const HostSpec &spec : mentions) names.push_back(spec.host);
  return names;
}

using Names = std::vector<std::string>;

TEST_CASE("identity: the names of this machine become the first one mentioned") {
  FakeResolver f = fake();
  const auto unified = unify_host_names(
      {mention("localhost", 1), mention("127.0.0.1", 2), mention("::1", 1), mention("me", 1)},
      f.resolver());
  CHECK(names_of(unified) == Names{"localhost", "localhost", "localhost", "localhost"});
  // Slots, origins and users are kept as written.
  CHECK(unified[1] == mention("localhost", 2));
}

TEST_CASE("identity: -H localhost:1,127.0.0.1:2 is one host with 3 slots") {
  FakeResolver f = fake();
  const auto hosts = merge_hosts(
      unify_host_names({mention("localhost", 1), mention("127.0.0.1", 2)}, f.resolver()), {});
  REQUIRE(hosts.size() == 1);
  CHECK(hosts[0] == Host{"", "localhost", 3, std::nullopt});
}

TEST_CASE("identity: other names sharing an address are one host, the first name wins") {
  FakeResolver f = fake();
  const auto unified =
      unify_host_names({mention("10.0.0.1", 1), mention("node2", 2), mention("node1", 1),
                        mention("fd00::2", 1), mention("node1.example", 1)},
                       f.resolver());
  CHECK(names_of(unified) == Names{"10.0.0.1", "node2", "10.0.0.1", "node2", "10.0.0.1"});
}

TEST_CASE("identity: different machines, and names that do not resolve, stay apart") {
  FakeResolver f = fake();
  const auto unified =
      unify_host_names({mention("node1", 1), mention("node2", 1), mention("localhost", 1),
                        mention("nosuch", 1), mention("nosuch2", 1)},
                       f.resolver());
  CHECK(names_of(unified) == Names{"node1", "node2", "localhost", "nosuch", "nosuch2"});
}

TEST_CASE("identity: users stay part of the host") {
  FakeResolver f = fake();
  const auto hosts = merge_hosts(
      unify_host_names({mention("node1", 1, "-H", "alice"), mention("10.0.0.1", 1, "-H", "bob"),
                        mention("node1.example", 2, "-H", "alice")},
                       f.resolver()),
      {});
  CHECK(hosts == std::vector<Host>{Host{"alice", "node1", 3, std::nullopt},
                                   Host{"bob", "node1", 1, std::nullopt}});
}

TEST_CASE("identity: each name is resolved once") {
  FakeResolver f = fake();
  unify_host_names({mention("node1", 1), mention("node1", 1), mention("127.0.0.1", 1),
                    mention("127.0.0.1", 1), mention("node1", 1)},
                   f.resolver());
  CHECK(f.asked == std::map<std::string, int>{{"127.0.0.1", 1}, {"node1", 1}});
}

TEST_CASE("identity: this machine's resolver knows its own names") {
  for (const std::string &name : Names{"localhost", "127.0.0.1", "::1", local_hostname()}) {
    CAPTURE(name);
    CHECK(resolve_host(name).this_machine);
  }
  CHECK_FALSE(resolve_host("192.0.2.1").this_machine);  // TEST-NET-1, never this machine
  CHECK(resolve_host("192.0.2.1").addresses == Names{"192.0.2.1"});
}

}  // namespace
}  // namespace perseus::launch

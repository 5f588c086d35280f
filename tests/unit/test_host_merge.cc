#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include "lib/launch/errors.h"
#include "lib/launch/planning/host_merge.h"

namespace perseus::launch {
namespace {

HostSpec mention(std::string host, std::optional<int> slots, std::string origin,
                 std::optional<int> max_slots = std::nullopt, std::string user = "") {
  return HostSpec{std::move(user), std::move(host), slots, max_slots, std::move(origin)};
}

std::optional<int> no_gpus(const HostSpec &) { return std::nullopt; }

Host host(std::string name, int slots, std::optional<int> max_slots = std::nullopt,
          std::string user = "") {
  return Host{std::move(user), std::move(name), slots, max_slots};
}

TEST_CASE("merge: repeated hosts add their slots, in order of first mention") {
  std::vector<HostSpec> mentions = {mention("a", 2, "f:1"), mention("b", 1, "f:2"),
                                    mention("a", 3, "f:3")};
  CHECK(merge_hosts(mentions, no_gpus) == std::vector<Host>{host("a", 5), host("b", 1)});
}

TEST_CASE("merge: a host mentioned once, bare, gets its GPU count or 1") {
  std::vector<HostSpec> mentions = {mention("gpu", std::nullopt, "f:1"),
                                    mention("cpu", std::nullopt, "f:2")};
  BareSlots gpus = [](const HostSpec &spec) -> std::optional<int> {
    if (spec.host == "gpu") return 8;
    return std::nullopt;
  };
  CHECK(merge_hosts(mentions, gpus) == std::vector<Host>{host("gpu", 8), host("cpu", 1)});
  CHECK(merge_hosts(mentions, no_gpus) == std::vector<Host>{host("gpu", 1), host("cpu", 1)});
  CHECK(merge_hosts(mentions, BareSlots()) == std::vector<Host>{host("gpu", 1), host("cpu", 1)});
}

TEST_CASE("merge: the callback sees the mention and a count below 1 counts as unknown") {
  std::vector<HostSpec> mentions = {mention("n", std::nullopt, "f:7", std::nullopt, "alice")};
  std::string seen;
  auto zero = [&seen](const HostSpec &spec) -> std::optional<int> {
    seen = spec.user + "@" + spec.host + " " + spec.origin;
    return 0;
  };
  CHECK(merge_hosts(mentions, zero) == std::vector<Host>{host("n", 1, std::nullopt, "alice")});
  CHECK(seen == "alice@n f:7");
}

TEST_CASE("merge: a bare host repeated k times gets k slots, without asking for GPUs") {
  std::vector<HostSpec> mentions = {mention("a", std::nullopt, "-H"),
                                    mention("a", std::nullopt, "-H"),
                                    mention("a", std::nullopt, "-H")};
  int calls = 0;
  auto gpus = [&calls](const HostSpec &) -> std::optional<int> {
    ++calls;
    return 8;
  };
  CHECK(merge_hosts(mentions, gpus) == std::vector<Host>{host("a", 3)});
  CHECK(calls == 0);
}

TEST_CASE("merge: bare and explicit mentions of one host add up") {
  std::vector<HostSpec> mentions = {mention("a", std::nullopt, "f:1"), mention("a", 4, "f:2")};
  CHECK(merge_hosts(mentions, [](const HostSpec &) { return std::optional<int>(8); }) ==
        std::vector<Host>{host("a", 5)});
}

TEST_CASE("merge: the key is user@host as written") {
  std::vector<HostSpec> mentions = {
      mention("n", 1, "f:1", std::nullopt, "alice"), mention("n", 1, "f:2", std::nullopt, "bob"),
      mention("n", 1, "f:3"), mention("n", 2, "f:4", std::nullopt, "alice")};
  CHECK(merge_hosts(mentions, no_gpus) == std::vector<Host>{host("n", 3, std::nullopt, "alice"),
                                                            host("n", 1, std::nullopt, "bob"),
                                                            host("n", 1)});
}

TEST_CASE("merge: max_slots is the smallest given") {
  std::vector<HostSpec> mentions = {mention("a", 1, "f:1", 8), mention("a", 1, "f:2", 4),
                                    mention("a", std::nullopt, "f:3", 6)};
  CHECK(merge_hosts(mentions, no_gpus) == std::vector<Host>{host("a", 3, 4)});
}

TEST_CASE("merge: the GPU count of a bare host does not go past its max_slots") {
  std::vector<HostSpec> mentions = {mention("a", std::nullopt, "f:1", 2)};
  CHECK(merge_hosts(mentions, [](const HostSpec &) { return std::optional<int>(8); }) ==
        std::vector<Host>{host("a", 2, 2)});
}

TEST_CASE("merge: slots over max_slots name the origins") {
  std::vector<HostSpec> mentions = {mention("a", 2, "hosts.txt:1", 4), mention("b", 1, "-H"),
                                    mention("a", 3, "hosts.txt:3")};
  CHECK_THROWS_WITH_AS(merge_hosts(mentions, no_gpus),
                       "host 'a' gets 5 slots (from hosts.txt:1, hosts.txt:3) but its max_slots "
                       "is 4 (hosts.txt:1); lower its slots or raise max_slots",
                       InputError);
}

TEST_CASE("merge: many origins are cut short, -H is named once") {
  std::vector<HostSpec> mentions;
  for (int line = 1; line <= 7; ++line) {
    mentions.push_back(mention("a", 1, "f:" + std::to_string(line), 3, "u"));
  }
  mentions.push_back(mention("a", 1, "-H", std::nullopt, "u"));
  mentions.push_back(mention("a", 1, "-H", std::nullopt, "u"));
  CHECK_THROWS_WITH_AS(merge_hosts(mentions, no_gpus),
                       "host 'u@a' gets 9 slots (from f:1, f:2, f:3, f:4 and 4 more) but its "
                       "max_slots is 3 (f:1); lower its slots or raise max_slots",
                       InputError);
}

TEST_CASE("merge: more than 65536 slots on one host is an error") {
  std::vector<HostSpec> mentions = {mention("a", 65536, "f:1"), mention("a", 1, "f:2")};
  CHECK_THROWS_WITH_AS(merge_hosts(mentions, no_gpus),
                       "host 'a' gets 65537 slots (from f:1, f:2), more than the limit of 65536; "
                       "lower its slots",
                       InputError);
}

TEST_CASE("merge: no mentions, no hosts") { CHECK(merge_hosts({}, no_gpus).empty()); }

}  // namespace
}  // namespace perseus::launch

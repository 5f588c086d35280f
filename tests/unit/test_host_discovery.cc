#include <doctest/doctest.h>

#include <string>

#include "lib/launch/errors.h"
#include "lib/launch/launcher/host_discovery_script.h"
#include "lib/launch/planning/host_discovery.h"

namespace perseus::launch {
namespace {

std::string error_of(const std::string &output) {
  try {
    parse_discovered_hosts(output, "discover.sh");
  } catch (const InputError &error) {
    return error.what();
  }
  return "";
}

TEST_CASE("parse_discovered_hosts: host:slots lines, bare hosts, comments and blank lines") {
  const auto hosts = parse_discovered_hosts(
      "# the inventory\n\nnode1:4\n  node2  \r\nalice@node3:2\n[fe80::1]:8\n", "discover.sh");
  REQUIRE(hosts.size() == 4);
  CHECK(hosts[0].host == "node1");
  CHECK(hosts[0].slots == 4);
  CHECK(hosts[0].origin == "--host-discovery-script line 3");
  CHECK(hosts[1].host == "node2");
  CHECK(hosts[1].slots == 1);  // the -H grammar: a bare host is one slot
  CHECK(hosts[2].user == "alice");
  CHECK(hosts[2].slots == 2);
  CHECK(hosts[3].host == "fe80::1");
  CHECK(hosts[3].slots == 8);
  CHECK(parse_discovered_hosts("", "discover.sh").empty());
  CHECK(parse_discovered_hosts("node1:2", "d").size() == 1);  // no newline at the end
}

TEST_CASE("parse_discovered_hosts: a bad line is named with the script and its number") {
  const std::string spaces = error_of("node1:2\nnode 7\n");
  CHECK(spaces.find("--host-discovery-script discover.sh: line 2 of its output") !=
        std::string::npos);
  CHECK(spaces.find("host:slots") != std::string::npos);
  CHECK(error_of("node1:0\n").find("line 1") != std::string::npos);
  CHECK(error_of("node1:x\n").find("line 1") != std::string::npos);
}

TEST_CASE("discover_hosts: runs the script, names its failure, kills it at the timeout") {
  CHECK(discover_hosts("printf 'localhost:3\\n'").at(0).slots == 3);
  try {
    discover_hosts("echo inventory down >&2; exit 4");
    FAIL("no error");
  } catch (const LaunchError &error) {
    CHECK(std::string(error.what()).find("exited with code 4 (inventory down)") !=
          std::string::npos);
  }
  try {
    discover_hosts("sleep 30", 300);
    FAIL("no error");
  } catch (const LaunchError &error) {
    CHECK(std::string(error.what()).find("ran past") != std::string::npos);
  }
}

}  // namespace
}  // namespace perseus::launch

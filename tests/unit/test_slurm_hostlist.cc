#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <vector>

#include "lib/launch/errors.h"
#include "lib/launch/launch_config.h"
#include "lib/launch/planning/job_plan.h"
#include "lib/launch/planning/slurm_hostlist.h"

namespace perseus::launch {
namespace {

using Names = std::vector<std::string>;

Names hosts(std::string_view value) { return expand_slurm_hostlist(value, "SLURM_JOB_NODELIST"); }

std::vector<int> tasks(std::string_view value) {
  return expand_slurm_tasks_per_node(value, "SLURM_TASKS_PER_NODE");
}

template <typename Call>
std::string error_of(Call call) {
  try {
    call();
  } catch (const InputError &error) {
    return error.what();
  }
  return "";
}

std::string host_error(std::string_view value) {
  return error_of([&] { hosts(value); });
}

std::string tasks_error(std::string_view value) {
  return error_of([&] { tasks(value); });
}

TEST_CASE("Slurm host list: plain names, ranges, widths, several entries") {
  CHECK(hosts("node1") == Names{"node1"});
  CHECK(hosts("a,b.example.com,c_d") == Names{"a", "b.example.com", "c_d"});
  CHECK(hosts("gpu[01-04,07]") == Names{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07"});
  CHECK(hosts("n[8-10]") == Names{"n8", "n9", "n10"});
  CHECK(hosts("n[08-10]") == Names{"n08", "n09", "n10"});
  CHECK(hosts("n[098-101]") == Names{"n098", "n099", "n100", "n101"});
  CHECK(hosts("n[5]") == Names{"n5"});
  CHECK(hosts("[1-2]") == Names{"1", "2"});
  CHECK(hosts("gpu[01-02],login1,b-[01-02]") == Names{"gpu01", "gpu02", "login1", "b-01", "b-02"});
  // A suffix after the brackets, and several groups: their product, the first slowest.
  CHECK(hosts("n[1-2]-ib") == Names{"n1-ib", "n2-ib"});
  CHECK(hosts("rack[1-2]-n[1-3]") ==
        Names{"rack1-n1", "rack1-n2", "rack1-n3", "rack2-n1", "rack2-n2", "rack2-n3"});
  // Repeats are kept; merging them is the host list's business, not the grammar's.
  CHECK(hosts("a,a") == Names{"a", "a"});
}

TEST_CASE("Slurm host list: errors name the variable, the value, the entry and a fix") {
  const std::string backwards = host_error("gpu[3-1]");
  CHECK(backwards.find("SLURM_JOB_NODELIST 'gpu[3-1]'") == 0);
  CHECK(backwards.find("runs backwards") != std::string::npos);
  CHECK(backwards.find("[1-3]") != std::string::npos);
  CHECK(host_error("gpu[1-3").find("opens '['") != std::string::npos);
  CHECK(host_error("gpu1-3]").find("closes ']'") != std::string::npos);
  CHECK(host_error("g[1-[2]]").find("brackets inside brackets") != std::string::npos);
  CHECK(host_error("g[]").find("empty brackets") != std::string::npos);
  CHECK(host_error("g[1,,2]").find("empty number") != std::string::npos);
  CHECK(host_error("g[1-2-3]").find("two '-'") != std::string::npos);
  CHECK(host_error("g[a-b]").find("'a' in brackets") != std::string::npos);
  CHECK(host_error("g[1-1234567890123456789]").find("over 18 digits") != std::string::npos);
  CHECK(host_error("").find("names no host") != std::string::npos);
  CHECK(host_error("a,,b").find("empty entry") != std::string::npos);
  CHECK(host_error("a,").find("empty entry") != std::string::npos);
  CHECK(host_error("a b").find("byte 0x20") != std::string::npos);
  const std::string control = host_error(std::string("a\nb"));
  CHECK(control.find("\\x0A") != std::string::npos);
  CHECK(control.find('\n') == std::string::npos);
  // No value expands past the limit, however it is split.
  CHECK(host_error("n[0-99999]").find("more than 65536 hosts") != std::string::npos);
  CHECK(host_error("n[0-999]-[0-999]").find("more than 65536 hosts") != std::string::npos);
  CHECK(host_error("a[0-60000],b[0-60000]").find("more than 65536 hosts") != std::string::npos);
  CHECK(hosts("n[1-65536]").size() == 65536);
  CHECK(host_error("n[1-65536],x").find("more than 65536 hosts") != std::string::npos);
}

TEST_CASE("Slurm tasks per node: N and N(xK)") {
  CHECK(tasks("8") == std::vector<int>{8});
  CHECK(tasks("8(x4),4") == std::vector<int>{8, 8, 8, 8, 4});
  CHECK(tasks("2,1(x2),3") == std::vector<int>{2, 1, 1, 3});
  CHECK(tasks("65536(x1)") == std::vector<int>{65536});
  for (const char *bad : {"", "0", "x", "8(x0)", "8(4)", "8(x4", "(x4)", "8(x)", "8,,2", "-1",
                          "65537", "8(x4)2", " 8"}) {
    const std::string error = tasks_error(bad);
    CAPTURE(bad);
    CHECK(error.find("SLURM_TASKS_PER_NODE '") == 0);
    CHECK(error.find("8(x4),4") != std::string::npos);
  }
  CHECK(tasks_error("2(x40000),1(x30000)").find("more than 65536 nodes") != std::string::npos);
}

TEST_CASE("Slurm allocation: one host a node, with its count") {
  const std::vector<HostSpec> specs = slurm_allocation_hosts("gpu[01-03],cpu1", "8(x2),4,2");
  REQUIRE(specs.size() == 4);
  CHECK(specs[0] == HostSpec{"", "gpu01", 8, std::nullopt, "Slurm allocation"});
  CHECK(specs[2].host == "gpu03");
  CHECK(specs[2].slots == 4);
  CHECK(specs[3].host == "cpu1");
  CHECK(specs[3].slots == 2);
  const std::string mismatch = error_of([] { slurm_allocation_hosts("n[1-3]", "2(x2)"); });
  CHECK(mismatch.find("counts for 2 nodes") != std::string::npos);
  CHECK(mismatch.find("names 3") != std::string::npos);
  CHECK(mismatch.find("-H") != std::string::npos);
}

TEST_CASE("host mentions: -H and -hostfile, then the Slurm allocation, then the default hostfile") {
  LaunchConfig config;
  config.cluster.slurm_job_id = "42";
  config.cluster.slurm_nodelist = "perseus-test-n[1-2]";
  config.cluster.slurm_tasks_per_node = "3,1";
  config.cluster.default_hostfile = "/nonexistent/perseus/hostfile";
  config.cluster.default_hostfile_variable = "OMPI_MCA_orte_default_hostfile";
  std::vector<HostSpec> specs = host_mentions(config);
  REQUIRE(specs.size() == 2);
  CHECK(specs[0].host == "perseus-test-n1");
  CHECK(specs[0].slots == 3);
  CHECK(specs[1].slots == 1);
  CHECK(specs[1].origin == kSlurmAllocationOrigin);
  // -H wins over the allocation (and the agents then start as --rsh says).
  config.host_lists = {"perseus-test-other:2"};
  specs = host_mentions(config);
  REQUIRE(specs.size() == 1);
  CHECK(specs[0].origin == "-H");
  // Without an allocation: the default hostfile, named in its errors.
  config.host_lists.clear();
  config.cluster.slurm_nodelist.clear();
  const std::string error = [&] {
    try {
      host_mentions(config);
    } catch (const InputError &e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  CHECK(error.find("/nonexistent/perseus/hostfile") != std::string::npos);
  CHECK(error.find("OMPI_MCA_orte_default_hostfile") != std::string::npos);
  config.cluster.default_hostfile.clear();
  specs = host_mentions(config);
  REQUIRE(specs.size() == 1);
  CHECK(specs[0].origin == "default");
  // An allocation whose counts are missing is an error, not this machine alone.
  config.cluster.slurm_nodelist = "n1";
  config.cluster.slurm_tasks_per_node.clear();
  CHECK_THROWS_AS(host_mentions(config), InputError);
}

}  // namespace
}  // namespace perseus::launch

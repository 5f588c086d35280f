#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lib/launch/errors.h"
#include "lib/launch/planning/job_plan.h"
#include "lib/launch/planning/placement.h"
#include "lib/launch/planning/rank_environment.h"
#include "lib/launch/protocol/frame_channel.h"

namespace perseus::launch {
namespace {

const JobFacts kFacts{"perseus-job-42", "node-a", 29500};

// The variables as sorted "NAME=value" lines, so that a failed check shows them all.
std::string sorted_lines(const EnvironmentChanges &environment) {
  std::vector<std::string> lines;
  for (const auto &[name, value] : environment) lines.push_back(name + "=" + value);
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const std::string &line : lines) out += line + "\n";
  return out;
}

std::string in_order(const EnvironmentChanges &environment) {
  std::string out;
  for (const auto &[name, value] : environment) out += name + "=" + value + "\n";
  return out;
}

// What rank_environment must give a rank, from the numbers the placement rules define.
struct Expected {
  int rank, size, local_rank, local_size, node_rank, nodes, cross_rank, cross_size;
};

EnvironmentChanges expected_environment(const Expected &e, const JobFacts &job) {
  const auto s = [](int value) { return std::to_string(value); };
  return {{"OMPI_COMM_WORLD_RANK", s(e.rank)},
          {"OMPI_COMM_WORLD_SIZE", s(e.size)},
          {"OMPI_COMM_WORLD_LOCAL_RANK", s(e.local_rank)},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", s(e.local_size)},
          {"OMPI_COMM_WORLD_NODE_RANK", s(e.local_rank)},
          {"RANK", s(e.rank)},
          {"WORLD_SIZE", s(e.size)},
          {"LOCAL_RANK", s(e.local_rank)},
          {"LOCAL_WORLD_SIZE", s(e.local_size)},
          {"GROUP_RANK", s(e.node_rank)},
          {"GROUP_WORLD_SIZE", s(e.nodes)},
          {"ROLE_RANK", s(e.rank)},
          {"ROLE_WORLD_SIZE", s(e.size)},
          {"NODE_RANK", s(e.node_rank)},
          {"TORCHELASTIC_RESTART_COUNT", s(job.restart_count)},
          {"TORCHELASTIC_MAX_RESTARTS", s(job.max_restarts)},
          {"MASTER_ADDR", job.master_addr},
          {"MASTER_PORT", s(job.master_port)},
          {"HOROVOD_RANK", s(e.rank)},
          {"HOROVOD_SIZE", s(e.size)},
          {"HOROVOD_LOCAL_RANK", s(e.local_rank)},
          {"HOROVOD_LOCAL_SIZE", s(e.local_size)},
          {"HOROVOD_CROSS_RANK", s(e.cross_rank)},
          {"HOROVOD_CROSS_SIZE", s(e.cross_size)},
          {"PERSEUS_RANK", s(e.rank)},
          {"PERSEUS_SIZE", s(e.size)},
          {"PERSEUS_LOCAL_RANK", s(e.local_rank)},
          {"PERSEUS_LOCAL_SIZE", s(e.local_size)},
          {"PERSEUS_CROSS_RANK", s(e.cross_rank)},
          {"PERSEUS_CROSS_SIZE", s(e.cross_size)},
          {"PERSEUS_NODE_RANK", s(e.node_rank)},
          {"PERSEUS_NUM_NODES", s(e.nodes)},
          {"PERSEUS_JOB_ID", job.job_id},
          {"PERSEUS_RENDEZVOUS_ADDR", job.rendezvous_addr},
          {"PERSEUS_RENDEZVOUS_PORT", s(job.rendezvous_port)}};
}

std::vector<PlacementHost> slots(std::vector<int> counts) {
  std::vector<PlacementHost> hosts;
  for (int count : counts) hosts.push_back({count, std::nullopt});
  return hosts;
}

void check_all_ranks(const Placement &placement, const std::vector<Expected> &expected) {
  REQUIRE(placement.size() == static_cast<int>(expected.size()));
  for (const Expected &e : expected) {
    CAPTURE(e.rank);
    const EnvironmentChanges got = rank_environment(placement, e.rank, kFacts);
    CHECK(sorted_lines(got) == sorted_lines(expected_environment(e, kFacts)));
    // No variable is set twice.
    std::map<std::string, int> seen;
    for (const auto &entry : got) CHECK(++seen[entry.first] == 1);
  }
}

TEST_CASE("rank_environment: 2 hosts x 2 ranks, by slot") {
  const Placement placement = place_ranks(slots({2, 2}), {4, 0, MapBy::kSlot, false});
  // rank size local_rank local_size node_rank nodes cross_rank cross_size
  check_all_ranks(placement, {{0, 4, 0, 2, 0, 2, 0, 2},
                              {1, 4, 1, 2, 0, 2, 0, 2},
                              {2, 4, 0, 2, 1, 2, 1, 2},
                              {3, 4, 1, 2, 1, 2, 1, 2}});
}

TEST_CASE("rank_environment: 2 hosts x 2 ranks, by node") {
  const Placement placement = place_ranks(slots({2, 2}), {4, 0, MapBy::kNode, false});
  check_all_ranks(placement, {{0, 4, 0, 2, 0, 2, 0, 2},
                              {1, 4, 0, 2, 1, 2, 1, 2},
                              {2, 4, 1, 2, 0, 2, 0, 2},
                              {3, 4, 1, 2, 1, 2, 1, 2}});
}

TEST_CASE("rank_environment: uneven hosts give Horovod's cross rank and size") {
  // Host 0 has local ranks 0 and 1, host 1 only local rank 0: local rank 1 is on one host.
  const Placement placement = place_ranks(slots({2, 1}), {3, 0, MapBy::kSlot, false});
  check_all_ranks(placement,
                  {{0, 3, 0, 2, 0, 2, 0, 2}, {1, 3, 1, 2, 0, 2, 0, 1}, {2, 3, 0, 1, 1, 2, 1, 2}});
}

TEST_CASE("rank_environment: hosts without ranks are not nodes") {
  // Host 0 has no slots and host 2 is not needed: host 1 is the only node.
  const Placement placement = place_ranks(slots({0, 2, 2}), {2, 0, MapBy::kSlot, false});
  check_all_ranks(placement, {{0, 2, 0, 2, 0, 1, 0, 1}, {1, 2, 1, 2, 0, 1, 0, 1}});
}

TEST_CASE("rank_environment: the job facts are passed as they are") {
  const Placement placement = place_ranks(slots({1}), {1, 0, MapBy::kSlot, false});
  JobFacts facts{"id with spaces", "fe80::1", 1};
  facts.restart_count = 2;  // --max-restarts: the third round
  facts.max_restarts = 5;
  const EnvironmentChanges got = rank_environment(placement, 0, facts);
  CHECK(sorted_lines(got).find("TORCHELASTIC_RESTART_COUNT=2\n") != std::string::npos);
  CHECK(sorted_lines(got) == sorted_lines(expected_environment({0, 1, 0, 1, 0, 1, 0, 1}, facts)));
  CHECK_THROWS(rank_environment(placement, 1, facts));
}

// ---- exported_environment ----

EnvironmentLookup lookup_in(std::map<std::string, std::string> variables) {
  return [variables](const std::string &name) -> std::optional<std::string> {
    const auto it = variables.find(name);
    if (it == variables.end()) return std::nullopt;
    return it->second;
  };
}

TEST_CASE("exported_environment: -x NAME=value, -x NAME, -x of an unset name, -mca") {
  LaunchConfig config;
  config.exports = {"NCCL_DEBUG=INFO",        "PATH", "UNSET_VAR", "B=x=y", "EMPTY=", "BLANK",
                    "WEIRD=$(id) `x` \"q\"\n"};
  config.mca = {{"btl", "^openib"}, {"pml", "ob1"}};
  std::vector<std::string> warnings;
  const EnvironmentChanges exported = exported_environment(
      config, lookup_in({{"PATH", "/usr/bin:/bin"}, {"BLANK", ""}, {"NCCL_DEBUG", "WARN"}}),
      warnings);
  CHECK(in_order(exported) ==
        "NCCL_DEBUG=INFO\n"
        "PATH=/usr/bin:/bin\n"
        "B=x=y\n"
        "EMPTY=\n"
        "BLANK=\n"
        "WEIRD=$(id) `x` \"q\"\n\n"
        "OMPI_MCA_btl=^openib\n"
        "OMPI_MCA_pml=ob1\n");
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("-x UNSET_VAR") != std::string::npos);
  CHECK(warnings[0].find("not set") != std::string::npos);
  CHECK(warnings[0].find("not passed on") != std::string::npos);
}

TEST_CASE("exported_environment: names that are not environment names are refused") {
  for (const std::string bad : {"A B=1", "1A=2", "A-B", "A.B=1", "=1", "A\tB", "\xc3\xa9=1"}) {
    CAPTURE(bad);
    LaunchConfig config;
    config.exports = {bad};
    std::vector<std::string> warnings;
    CHECK_THROWS_WITH_AS(exported_environment(
                             config, [](const std::string &) { return std::nullopt; }, warnings),
                         doctest::Contains(("-x '" + bad + "'").c_str()), InputError);
  }
  for (const std::string good : {"A=1", "_x=y z", "NCCL_DEBUG=INFO", "a1_B2=", "PATH"}) {
    CAPTURE(good);
    LaunchConfig config;
    config.exports = {good};
    std::vector<std::string> warnings;
    CHECK_NOTHROW(exported_environment(
        config, [](const std::string &) { return std::string("v"); }, warnings));
  }
}

TEST_CASE("exported_environment: warnings are appended, one per unset name") {
  LaunchConfig config;
  config.exports = {"A", "B", "C"};
  std::vector<std::string> warnings = {"earlier"};
  const EnvironmentChanges exported =
      exported_environment(config, lookup_in({{"B", "b"}}), warnings);
  CHECK(in_order(exported) == "B=b\n");
  REQUIRE(warnings.size() == 3);
  CHECK(warnings[0] == "earlier");
  CHECK(warnings[1].find("-x A") != std::string::npos);
  CHECK(warnings[2].find("-x C") != std::string::npos);
}

TEST_CASE("exported_environment: nothing to export") {
  std::vector<std::string> warnings;
  CHECK(exported_environment(LaunchConfig{}, lookup_in({}), warnings).empty());
  CHECK(warnings.empty());
}

TEST_CASE("exported_environment: -x without a name is an InputError") {
  for (const std::string entry : {"=x", "=", ""}) {
    CAPTURE(entry);
    LaunchConfig config;
    config.exports = {"A=1", entry};
    std::vector<std::string> warnings;
    CHECK_THROWS_WITH_AS(exported_environment(config, lookup_in({}), warnings),
                         doctest::Contains(("-x '" + entry + "'").c_str()), InputError);
  }
}

// ---- plan_job ----

HostSpec mention(const std::string &host, int slot_count, const std::string &user = "") {
  return HostSpec{user, host, slot_count, std::nullopt, "-H"};
}

// Hellos by host name.
struct Hellos {
  std::map<std::string, Hello> by_host;
  const Hello &operator()(const Host &host) const { return by_host.at(host.host); }
};

Hello hello(std::optional<int> gpus, std::optional<std::string> visible = std::nullopt) {
  return Hello{"0.1.0", kProtocolVersion, "h", 16, gpus, std::move(visible)};
}

// The last value given to `name`: what the rank sees, as later entries override earlier ones.
std::optional<std::string> last_value(const EnvironmentChanges &environment,
                                      const std::string &name) {
  std::optional<std::string> value;
  for (const auto &[n, v] : environment) {
    if (n == name) value = v;
  }
  return value;
}

// The variables a rank of `job` gets from perseusrun (as the agent sets them).
EnvironmentChanges effective(const JobDescription &job, const RankLaunch &launch) {
  return rank_changes(job, launch);
}

// What a rank sees: the last value of each name.
std::map<std::string, std::string> seen(const EnvironmentChanges &environment) {
  std::map<std::string, std::string> values;
  for (const auto &[name, value] : environment) values[name] = value;
  return values;
}

std::string ranks_of(const JobDescription &job) {
  std::string out;
  for (const RankLaunch &rank : job.ranks)
    out += (out.empty() ? "" : " ") + std::to_string(rank.rank);
  return out;
}

LaunchConfig config_for(int np, GpuBind bind = GpuBind::kList, MapBy map_by = MapBy::kSlot) {
  LaunchConfig config;
  config.np = np;
  config.gpu_bind = bind;
  config.map_by = map_by;
  config.command = {"python", "train.py", "--lr", "$LR"};
  config.working_directory = "/work dir";
  config.kill_grace_seconds = 3;
  return config;
}

TEST_CASE("plan_job: 3 hosts, 4 ranks: descriptions, stdin rank, unused host") {
  const Hellos hellos{{{"a", hello(8)}, {"b", hello(std::nullopt)}, {"c", hello(8)}}};
  const EnvironmentChanges exported = {{"NCCL_DEBUG", "INFO"}, {"OMPI_MCA_btl", "tcp"}};
  const JobPlan plan =
      plan_job(config_for(4), {mention("a", 2, "alice"), mention("b", 2), mention("c", 2)}, {},
               hellos, kFacts, exported);
  REQUIRE(plan.hosts.size() == 3);
  REQUIRE(plan.jobs.size() == 3);
  CHECK(plan.placement.size() == 4);
  CHECK(ranks_of(plan.jobs[0]) == "0 1");
  CHECK(ranks_of(plan.jobs[1]) == "2 3");
  CHECK(ranks_of(plan.jobs[2]) == "");
  CHECK(plan.jobs[0].stdin_rank == 0);
  CHECK(plan.jobs[1].stdin_rank == -1);
  CHECK(plan.jobs[2].stdin_rank == -1);
  const std::vector<std::string> labels = {"a", "b", "c"};
  for (size_t i = 0; i < plan.jobs.size(); ++i) {
    const JobDescription &job = plan.jobs[i];
    CAPTURE(i);
    CHECK(job.job_id == kFacts.job_id);
    CHECK(job.host_label == labels[i]);
    CHECK(job.argv == std::vector<std::string>{"python", "train.py", "--lr", "$LR"});
    CHECK(job.working_directory == "/work dir");
    CHECK(job.kill_grace_seconds == 3);
  }
  // Each rank: the exported variables, then its own, then its GPUs.
  for (const JobDescription &job : plan.jobs) {
    for (const RankLaunch &launch : job.ranks) {
      CAPTURE(launch.rank);
      EnvironmentChanges expected = exported;
      const EnvironmentChanges own = rank_environment(plan.placement, launch.rank, kFacts);
      expected.insert(expected.end(), own.begin(), own.end());
      expected.emplace_back("CUDA_VISIBLE_DEVICES", "0,1");
      CHECK(seen(effective(job, launch)) == seen(expected));
    }
  }
}

TEST_CASE("plan_job: stdin_rank is 0 only on the host of rank 0") {
  const Hellos hellos{{{"a", hello(8)}, {"b", hello(8)}}};
  SUBCASE("first host has no slots") {
    const JobPlan plan =
        plan_job(config_for(2), {mention("a", 0), mention("b", 2)}, {}, hellos, kFacts, {});
    REQUIRE(plan.jobs.size() == 2);
    CHECK(ranks_of(plan.jobs[0]) == "");
    CHECK(ranks_of(plan.jobs[1]) == "0 1");
    CHECK(plan.jobs[0].stdin_rank == -1);
    CHECK(plan.jobs[1].stdin_rank == 0);
  }
  SUBCASE("by node") {
    const JobPlan plan = plan_job(config_for(4, GpuBind::kList, MapBy::kNode),
                                  {mention("a", 2), mention("b", 2)}, {}, hellos, kFacts, {});
    REQUIRE(plan.jobs.size() == 2);
    CHECK(ranks_of(plan.jobs[0]) == "0 2");
    CHECK(ranks_of(plan.jobs[1]) == "1 3");
    CHECK(plan.jobs[0].stdin_rank == 0);
    CHECK(plan.jobs[1].stdin_rank == -1);
  }
}

TEST_CASE("plan_job: CUDA_VISIBLE_DEVICES from -x overrides the host's own") {
  const Hellos hellos{{{"a", hello(8, "0,1,2,3")}, {"b", hello(std::nullopt, "4,5")}}};
  const std::vector<HostSpec> mentions = {mention("a", 2), mention("b", 2)};
  struct Row {
    GpuBind bind;
    EnvironmentChanges exported;
    std::string per_rank;  // the last CUDA_VISIBLE_DEVICES of each rank, "-" for none
  };
  const std::vector<Row> rows = {
      {GpuBind::kList, {}, "0,1 0,1 4,5 4,5"},
      {GpuBind::kIsolate, {}, "0 1 4 5"},
      {GpuBind::kList, {{"CUDA_VISIBLE_DEVICES", "6,7"}}, "6,7 6,7 6,7 6,7"},
      {GpuBind::kIsolate, {{"CUDA_VISIBLE_DEVICES", "6,7"}}, "6 7 6 7"},
      // The last -x of it counts.
      {GpuBind::kIsolate,
       {{"CUDA_VISIBLE_DEVICES", "9,9"}, {"CUDA_VISIBLE_DEVICES", "2,3"}},
       "2 3 2 3"},
      {GpuBind::kIsolate, {{"CUDA_VISIBLE_DEVICES", ""}}, "'' '' '' ''"},
      // none: only the exported value, if any, reaches the ranks.
      {GpuBind::kNone, {}, "- - - -"},
      {GpuBind::kNone, {{"CUDA_VISIBLE_DEVICES", "6,7"}}, "6,7 6,7 6,7 6,7"},
  };
  for (const Row &row : rows) {
    CAPTURE(static_cast<int>(row.bind));
    CAPTURE(in_order(row.exported));
    const JobPlan plan =
        plan_job(config_for(4, row.bind), mentions, {}, hellos, kFacts, row.exported);
    REQUIRE(plan.jobs.size() == 2);
    std::string got;
    for (const JobDescription &job : plan.jobs) {
      for (const RankLaunch &launch : job.ranks) {
        const auto value = last_value(effective(job, launch), "CUDA_VISIBLE_DEVICES");
        got += (got.empty() ? "" : " ") + (!value ? "-" : value->empty() ? "''" : *value);
      }
    }
    CHECK(got == row.per_rank);
  }
}

TEST_CASE("plan_job: too few GPUs names the host") {
  const Hellos hellos{{{"a", hello(8)}, {"gpu-poor", hello(1)}}};
  CHECK_THROWS_WITH_AS(
      plan_job(config_for(4), {mention("a", 2), mention("gpu-poor", 2)}, {}, hellos, kFacts, {}),
      doctest::Contains("host gpu-poor"), InputError);
  // With -x CUDA_VISIBLE_DEVICES of two entries it fits.
  CHECK_NOTHROW(plan_job(config_for(4), {mention("a", 2), mention("gpu-poor", 2)}, {}, hellos,
                         kFacts, {{"CUDA_VISIBLE_DEVICES", "0,1"}}));
}

TEST_CASE("plan_job: bare mentions take their slots from bare_slots") {
  const Hellos hellos{{{"a", hello(4)}, {"b", hello(4)}}};
  const BareSlots four = [](const HostSpec &) { return std::optional<int>(4); };
  const std::vector<HostSpec> mentions = {HostSpec{"", "a", std::nullopt, std::nullopt, "-H"},
                                          HostSpec{"", "b", std::nullopt, std::nullopt, "-H"}};
  const JobPlan plan = plan_job(config_for(0), mentions, four, hellos, kFacts, {});
  CHECK(plan.placement.size() == 8);
  CHECK(ranks_of(plan.jobs[0]) == "0 1 2 3");
  CHECK(ranks_of(plan.jobs[1]) == "4 5 6 7");
}

// ---- the job description's size ----

// The encoded description of -np `np` ranks on one host without GPUs (every rank's
// CUDA_VISIBLE_DEVICES is the list 0..np-1).
size_t description_bytes(int np) {
  LaunchConfig config = config_for(np);
  config.oversubscribe = true;
  const Hellos hellos{{{"a", hello(std::nullopt)}}};
  const JobPlan plan = plan_job(config, {mention("a", 1)}, {}, hellos, kFacts, {{"X", "1"}});
  return encode(plan.jobs.at(0)).size();
}

TEST_CASE("plan_job: the job description grows linearly with the ranks of a host") {
  const size_t small = description_bytes(1000);
  const size_t large = description_bytes(8000);
  CAPTURE(small);
  CAPTURE(large);
  // Quadratic growth would make it 64 times larger; a few hundred bytes per rank is linear.
  CHECK(large < 9 * small);
  CHECK(large / 8000 < 400);
  CHECK(description_bytes(kMaxRanks) < kMaxFramePayload);
}

TEST_CASE("plan_job: shared variables are sent once, what differs per rank") {
  const Hellos hellos{{{"a", hello(std::nullopt)}}};
  const JobPlan plan = plan_job(config_for(3), {mention("a", 3)}, {}, hellos, kFacts,
                                {{"NCCL_DEBUG", "INFO"}, {"RANK", "99"}});
  const JobDescription &job = plan.jobs.at(0);
  CHECK(last_value(job.common_environment, "NCCL_DEBUG") == "INFO");
  CHECK(last_value(job.common_environment, "WORLD_SIZE") == "3");
  CHECK(last_value(job.common_environment, "CUDA_VISIBLE_DEVICES") == "0,1,2");
  for (const RankLaunch &launch : job.ranks) {
    CAPTURE(launch.rank);
    CHECK_FALSE(last_value(launch.environment, "WORLD_SIZE").has_value());
    // A name with a value per rank stays per rank, -x's value included, so that the rank's
    // own value still comes last and wins.
    CHECK_FALSE(last_value(job.common_environment, "RANK").has_value());
    CHECK(last_value(effective(job, launch), "RANK") == std::to_string(launch.rank));
  }
}

TEST_CASE("plan_job: the layers' precedence: -x < the rank variables < the GPU binding") {
  // Each name set by -x and again by a higher layer; the rank sees the highest layer's value,
  // on a host of one rank (everything shared) and of three (shared and own lists).
  for (const int np : {1, 3}) {
    CAPTURE(np);
    const Hellos hellos{{{"a", hello(8)}}};
    const EnvironmentChanges exported = {{"PERSEUS_RANK", "99"},
                                         {"RANK", "99"},
                                         {"PERSEUS_SIZE", "99"},
                                         {"MASTER_PORT", "1"},
                                         {"CUDA_VISIBLE_DEVICES", "5,6,7"},
                                         {"NCCL_DEBUG", "INFO"}};
    const JobPlan plan = plan_job(config_for(np, GpuBind::kIsolate), {mention("a", np)}, {}, hellos,
                                  kFacts, exported);
    const JobDescription &job = plan.jobs.at(0);
    for (const RankLaunch &launch : job.ranks) {
      CAPTURE(launch.rank);
      const auto got = seen(effective(job, launch));
      const std::string r = std::to_string(launch.rank);
      CHECK(got.at("PERSEUS_RANK") == r);
      CHECK(got.at("RANK") == r);
      CHECK(got.at("PERSEUS_SIZE") == std::to_string(np));
      CHECK(got.at("MASTER_PORT") == std::to_string(kFacts.master_port));
      // The binding picks from -x's devices, one each.
      CHECK(got.at("CUDA_VISIBLE_DEVICES") == std::to_string(5 + launch.rank));
      CHECK(got.at("NCCL_DEBUG") == "INFO");  // nothing above it: -x's value stands
    }
  }
}

TEST_CASE("plan_job: more ranks than kMaxRanks from the slots is an InputError") {
  const Hellos hellos{{{"a", hello(std::nullopt)}, {"b", hello(std::nullopt)}}};
  CHECK_THROWS_WITH_AS(
      plan_job(config_for(0), {mention("a", 65536), mention("b", 2)}, {}, hellos, kFacts, {}),
      doctest::Contains("65538 ranks (from the slots) is more than the 65536"), InputError);
}

TEST_CASE("host_key") {
  CHECK(host_key("", "node1") == "node1");
  CHECK(host_key("alice", "node1") == "alice@node1");
}

}  // namespace
}  // namespace perseus::launch

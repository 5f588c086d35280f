// The launcher-library contract (lib/rendezvous/job_contract.h) held from both ends: the
// environment perseusrun's planning makes for each rank (lib/launch/planning/rank_environment.cc,
// plus the secret file's variable the agent adds) is read back by libperseus's parser
// (lib/comm/job_environment.cc), and every rank learns the place the placement gave it.

#include <doctest/doctest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lib/comm/job_environment.h"
#include "lib/launch/planning/placement.h"
#include "lib/launch/planning/rank_environment.h"
#include "lib/rendezvous/job_contract.h"

namespace perseus {
namespace {

using launch::EnvironmentChanges;
using launch::JobFacts;
using launch::MapBy;
using launch::Placement;
using launch::PlacementHost;

// read_job_environment takes a plain function pointer: the rank's environment is a global
// while a check runs.
std::map<std::string, std::string> g_environment;

const char *lookup(const char *name) {
  const auto found = g_environment.find(name);
  return found == g_environment.end() ? nullptr : found->second.c_str();
}

// What a rank's process sees: the launcher's variables, and the agent's secret file's.
void become_rank(const Placement &placement, int rank, const JobFacts &facts) {
  g_environment.clear();
  for (const auto &[name, value] : launch::rank_environment(placement, rank, facts)) {
    g_environment[name] = value;
  }
  g_environment[contract::kSecretFile] = "/run/user/1000/perseus-secret-7";
}

Placement place(const std::vector<int> &slots, int np, MapBy by) {
  std::vector<PlacementHost> hosts;
  for (int count : slots) hosts.push_back({count, std::nullopt});
  return launch::place_ranks(hosts, {np, 0, by, false});
}

const JobFacts kFacts{"job-contract-1", "10.0.0.1", 29500, "10.0.0.1", 41234,
                      "secret-bytes",   "",         ""};

TEST_CASE("job contract: every rank reads back the place perseusrun planned for it") {
  // Uneven hosts, both mappings: local, cross and node numbers all differ from the rank.
  for (const MapBy by : {MapBy::kSlot, MapBy::kNode}) {
    const Placement placement = place({3, 1, 2}, 6, by);
    for (int rank = 0; rank < placement.size(); ++rank) {
      CAPTURE(rank);
      const launch::RankPlace &planned = placement.ranks.at(static_cast<size_t>(rank));
      become_rank(placement, rank, kFacts);
      const comm::JobEnvironment got = comm::read_job_environment(lookup);
      CHECK(got.rank == planned.rank);
      CHECK(got.size == placement.size());
      CHECK(got.local_rank == planned.local_rank);
      CHECK(got.local_size == planned.local_size);
      CHECK(got.cross_rank == planned.cross_rank);
      CHECK(got.cross_size == planned.cross_size);
      CHECK(got.node_rank == planned.node_rank);
      CHECK(got.job_id == kFacts.job_id);
      CHECK(got.rendezvous_addr == kFacts.rendezvous_addr);
      CHECK(got.rendezvous_port == kFacts.rendezvous_port);
      CHECK(got.secret_file == g_environment[contract::kSecretFile]);
    }
  }
}

TEST_CASE("job contract: the launcher sets every variable that marks a Perseus launcher") {
  const Placement placement = place({2}, 2, MapBy::kSlot);
  become_rank(placement, 1, kFacts);
  const std::string seen = comm::launcher_variables(lookup);
  for (const char *name : contract::kLauncherVariables) {
    CAPTURE(name);
    CHECK(g_environment.count(name) == 1);
    CHECK(seen.find(std::string(name) + "=") != std::string::npos);
  }
  // The secret itself never reaches a rank's environment, only the file's path.
  for (const auto &[name, value] : g_environment)
    CHECK(value.find("secret-bytes") == std::string::npos);
}

TEST_CASE("job contract: PERSEUS_LIBRARY goes to the ranks only when the launcher found one") {
  const Placement placement = place({1}, 1, MapBy::kSlot);
  become_rank(placement, 0, kFacts);
  CHECK(g_environment.count(contract::kLibrary) == 0);
  JobFacts with_library = kFacts;
  with_library.library = "/opt/perseus/lib/libperseus.so.0";
  become_rank(placement, 0, with_library);
  CHECK(g_environment[contract::kLibrary] == with_library.library);
}

TEST_CASE("job contract: store keys") {
  CHECK(contract::exit_key(0) == "perseus/exit/0");
  CHECK(contract::exit_key(12345) == "perseus/exit/12345");
  // The first-exit key is no rank's key, so no rank's note can overwrite it.
  CHECK(std::string(contract::kFirstExitKey) != contract::exit_key(0));
  CHECK(std::string(contract::kFirstExitKey).rfind("perseus/exit/", 0) == 0);
}

}  // namespace
}  // namespace perseus

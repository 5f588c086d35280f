#pragma once
// From the user's request and what each host's agent reported, the whole job: where every
// rank runs and what each agent is told. Pure, so it is tested without processes.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lib/launch/agent_protocol.h"
#include "lib/launch/host_merge.h"
#include "lib/launch/launch_config.h"
#include "lib/launch/placement.h"
#include "lib/launch/rank_environment.h"

namespace perseus::launch {

struct JobPlan {
  std::vector<Host> hosts;  // distinct hosts, in order of first mention
  Placement placement;
  std::vector<JobDescription> jobs;  // one per host, same order; empty ranks for unused hosts
};

// Looks a variable up in perseusrun's environment.
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string &)>;

// -x and -mca as variables for the ranks. `-x VAR` of an unset VAR adds a line to `warnings`.
EnvironmentChanges exported_environment(const LaunchConfig &config, const EnvironmentLookup &lookup,
                                        std::vector<std::string> &warnings);

// `hellos[i]` belongs to the host `host_key(hosts[i])` of the merged list; `bare_slots` decides
// the slots of bare mentions. Throws InputError for requests the hosts cannot satisfy.
JobPlan plan_job(const LaunchConfig &config, const std::vector<HostSpec> &mentions,
                 const BareSlots &bare_slots,
                 const std::function<const Hello &(const Host &)> &hello_of, const JobFacts &facts,
                 const EnvironmentChanges &exported);

std::string host_key(const std::string &user, const std::string &host);

}  // namespace perseus::launch

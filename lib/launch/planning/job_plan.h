#pragma once
// From the user's request and what each host's agent reported, the whole job: where every
// rank runs and what each agent is told. Pure, so it is tested without processes.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lib/launch/launch_config.h"
#include "lib/launch/planning/host_merge.h"
#include "lib/launch/planning/placement.h"
#include "lib/launch/planning/rank_environment.h"
#include "lib/launch/protocol/agent_protocol.h"

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

// The host mentions of a configuration: -H, the hostfile, or when neither is given the Slurm
// allocation (origin "Slurm allocation"), Open MPI's default hostfile, or this machine alone
// (origin "default"), in that order; with the names of one machine unified (host_identity.h).
// Both -H and a hostfile is an InputError.
std::vector<HostSpec> host_mentions(const LaunchConfig &config);

// Slots of bare mentions: the host's GPU count when its agent found GPUs; for the default host
// (no hosts given) its core count without GPUs; else unset (1).
BareSlots slots_from_hellos(const std::function<const Hello &(const HostSpec &)> &hello_of);

// GPUs found busy on a host by the preflight (indices and UUIDs), and a description of their
// processes for messages.
struct BusyGpus {
  std::vector<std::string> ids;
  std::string detail;
};
using BusyGpusOf = std::function<BusyGpus(const Host &)>;

// Where the ranks go: the merged hosts (`bare_slots` decides the slots of bare mentions) and
// the placement; `jobs` stays empty. Throws InputError for requests the hosts cannot satisfy.
JobPlan place_job(const LaunchConfig &config, const std::vector<HostSpec> &mentions,
                  const BareSlots &bare_slots);

// Fills `plan.jobs` (from place_job): each host's job description, with the facts that are
// known once rank 0's host is (MASTER_ADDR, the store's address) and the GPUs the preflight
// found busy. Throws InputError when a host has too few GPUs for its ranks.
using HelloOf = std::function<const Hello &(const Host &)>;
void describe_jobs(const LaunchConfig &config, JobPlan &plan, const HelloOf &hello_of,
                   const JobFacts &facts, const EnvironmentChanges &exported,
                   const BusyGpusOf &busy_of = {});

// Both at once. `hello_of(host)` is the Hello of that host of the merged list.
JobPlan plan_job(const LaunchConfig &config, const std::vector<HostSpec> &mentions,
                 const BareSlots &bare_slots, const HelloOf &hello_of, const JobFacts &facts,
                 const EnvironmentChanges &exported, const BusyGpusOf &busy_of = {});

std::string host_key(const std::string &user, const std::string &host);

}  // namespace perseus::launch

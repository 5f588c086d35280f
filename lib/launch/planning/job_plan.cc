#include "lib/launch/planning/job_plan.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "lib/launch/errors.h"
#include "lib/launch/planning/host_identity.h"
#include "lib/launch/planning/host_list_parser.h"
#include "lib/launch/planning/hostfile_parser.h"
#include "lib/launch/planning/slurm_hostlist.h"

namespace perseus::launch {

namespace {

std::optional<std::string> exported_value(const EnvironmentChanges &exported,
                                          const std::string &name) {
  std::optional<std::string> value;
  for (const auto &[n, v] : exported) {
    if (n == name) value = v;
  }
  return value;
}

// Moves the variables that every rank gets with the same value out of the ranks' lists, into
// the list it returns. A name stays per rank when any of its entries differs between ranks,
// so that the value the rank ends up with is the same as before. Expects every rank's list to
// name the same variables in the same order (rank_environment's), else it keeps every list.
EnvironmentChanges factor_common(std::vector<RankLaunch> &ranks) {
  if (ranks.empty()) return {};
  const EnvironmentChanges first = ranks.front().environment;  // a copy: the lists change below
  std::vector<bool> same(first.size(), true);
  for (const RankLaunch &rank : ranks) {
    if (rank.environment.size() != first.size()) return {};
    for (size_t k = 0; k < first.size(); ++k) {
      if (rank.environment[k].first != first[k].first) return {};
      same[k] = same[k] && rank.environment[k].second == first[k].second;
    }
  }
  std::set<std::string> varying;
  for (size_t k = 0; k < first.size(); ++k) {
    if (!same[k]) varying.insert(first[k].first);
  }
  std::vector<bool> common(first.size());
  for (size_t k = 0; k < first.size(); ++k) common[k] = !varying.count(first[k].first);
  EnvironmentChanges shared;
  for (size_t k = 0; k < first.size(); ++k) {
    if (common[k]) shared.push_back(first[k]);
  }
  for (RankLaunch &rank : ranks) {
    EnvironmentChanges own;
    for (size_t k = 0; k < first.size(); ++k) {
      if (!common[k]) own.push_back(std::move(rank.environment[k]));
    }
    rank.environment = std::move(own);
  }
  return shared;
}

JobDescription describe_host(const LaunchConfig &config, const JobPlan &plan, size_t host_index,
                             const Hello &hello, const JobFacts &facts,
                             const EnvironmentChanges &exported, const BusyGpus &busy) {
  JobDescription job;
  job.job_id = facts.job_id;
  job.host_label = plan.hosts[host_index].host;
  job.argv = config.command;
  job.working_directory = config.working_directory;
  job.kill_grace_seconds = config.kill_grace_seconds;
  job.heartbeat_timeout_seconds = config.heartbeat_timeout_seconds;
  job.secret = facts.secret;
  std::vector<int> local_ranks;
  for (const RankPlace &place : plan.placement.ranks) {
    if (place.host_index == static_cast<int>(host_index)) local_ranks.push_back(place.rank);
  }
  HostGpuFacts gpus{hello.gpu_count, hello.cuda_visible_devices, busy.ids, busy.detail};
  if (auto visible = exported_value(exported, "CUDA_VISIBLE_DEVICES")) {
    gpus.cuda_visible_devices = visible;
  }
  const GpuAllotment devices =
      allot_gpus(config.gpu_bind, gpus, static_cast<int>(local_ranks.size()), job.host_label);
  for (size_t i = 0; i < local_ranks.size(); ++i) {
    RankLaunch launch{local_ranks[i], exported};
    const EnvironmentChanges own = rank_environment(plan.placement, local_ranks[i], facts);
    launch.environment.insert(launch.environment.end(), own.begin(), own.end());
    if (!devices.shared && devices.own[i]) {
      launch.environment.emplace_back("CUDA_VISIBLE_DEVICES", *devices.own[i]);
    }
    if (local_ranks[i] == 0) job.stdin_rank = 0;
    job.ranks.push_back(std::move(launch));
  }
  job.common_environment = factor_common(job.ranks);
  if (devices.shared) job.common_environment.emplace_back("CUDA_VISIBLE_DEVICES", *devices.shared);
  return job;
}

// A name a shell can export: letters, digits and '_', not starting with a digit.
bool valid_variable_name(const std::string &name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return c == '_' || std::isalnum(static_cast<unsigned char>(c));
  });
}

void check_variable_name(const std::string &name, const std::string &written) {
  if (name.empty()) {
    throw InputError("-x '" + written +
                     "': expected a variable name, as in -x NAME or -x NAME=value");
  }
  if (!valid_variable_name(name)) {
    throw InputError("-x '" + written + "': '" + name +
                     "' is not a valid environment variable name (letters, digits and '_', not "
                     "starting with a digit), as in -x NAME or -x NAME=value");
  }
}

}  // namespace

void check_rank_count(long long np, const std::string &source) {
  if (np > kMaxRanks) {
    throw InputError(source + " is more than the " + std::to_string(kMaxRanks) +
                     " ranks perseusrun runs in one job; lower it");
  }
}

std::vector<HostSpec> host_mentions(const LaunchConfig &config) {
  if (!config.host_lists.empty() && !config.hostfile.empty()) {
    throw InputError("both -H and -hostfile " + config.hostfile + " name hosts; give one of them");
  }
  std::vector<HostSpec> mentions;
  for (const std::string &list : config.host_lists) {
    for (HostSpec &spec : parse_host_list(list)) mentions.push_back(std::move(spec));
  }
  if (!config.hostfile.empty()) mentions = read_hostfile(config.hostfile);
  const ClusterEnvironment &cluster = config.cluster;
  if (config.host_lists.empty() && config.hostfile.empty()) {
    if (!cluster.slurm_nodelist.empty()) {
      if (cluster.slurm_tasks_per_node.empty()) {
        throw InputError("Slurm job " + cluster.slurm_job_id +
                         ": SLURM_JOB_NODELIST is set but SLURM_TASKS_PER_NODE is not; run "
                         "perseusrun inside the allocation (salloc, sbatch), or give -H");
      }
      mentions = slurm_allocation_hosts(cluster.slurm_nodelist, cluster.slurm_tasks_per_node);
    } else if (!cluster.default_hostfile.empty()) {
      try {
        mentions = read_hostfile(cluster.default_hostfile);
      } catch (const InputError &error) {
        throw InputError(std::string(error.what()) + "\n(the hostfile named by " +
                         cluster.default_hostfile_variable + ")");
      }
    }
  }
  if (mentions.empty()) mentions.push_back(HostSpec{"", "localhost", {}, {}, "default"});
  return unify_host_names(std::move(mentions), resolve_host);
}

BareSlots slots_from_hellos(const std::function<const Hello &(const HostSpec &)> &hello_of) {
  return [hello_of](const HostSpec &spec) -> std::optional<int> {
    const Hello &hello = hello_of(spec);
    if (hello.gpu_count && *hello.gpu_count > 0) return hello.gpu_count;
    if (spec.origin == "default") return hello.cpu_count;
    return std::nullopt;
  };
}

std::string host_key(const std::string &user, const std::string &host) {
  return user.empty() ? host : user + "@" + host;
}

EnvironmentChanges exported_environment(const LaunchConfig &config, const EnvironmentLookup &lookup,
                                        std::vector<std::string> &warnings) {
  EnvironmentChanges exported;
  for (const std::string &entry : config.exports) {
    const size_t equals = entry.find('=');
    const std::string name = entry.substr(0, equals);
    check_variable_name(name, entry);
    if (equals != std::string::npos) {
      exported.emplace_back(name, entry.substr(equals + 1));
    } else if (auto value = lookup(name)) {
      exported.emplace_back(name, *value);
    } else {
      warnings.push_back("-x " + name + ": " + name +
                         " is not set in perseusrun's environment, so it is not passed on");
    }
  }
  for (const auto &[name, value] : config.mca) {
    exported.emplace_back("OMPI_MCA_" + name, value);
  }
  return exported;
}

JobPlan place_job(const LaunchConfig &config, const std::vector<HostSpec> &mentions,
                  const BareSlots &bare_slots) {
  JobPlan plan;
  plan.hosts = merge_hosts(mentions, bare_slots);
  std::vector<PlacementHost> capacity;
  for (const Host &host : plan.hosts) capacity.push_back({host.slots, host.max_slots});
  plan.placement =
      place_ranks(capacity, {config.np, config.npernode, config.map_by, config.oversubscribe});
  check_rank_count(static_cast<long long>(plan.placement.size()),
                   std::to_string(plan.placement.size()) + " ranks (from the slots)");
  return plan;
}

void describe_jobs(const LaunchConfig &config, JobPlan &plan, const HelloOf &hello_of,
                   const JobFacts &facts, const EnvironmentChanges &exported,
                   const BusyGpusOf &busy_of) {
  plan.jobs.clear();
  for (size_t i = 0; i < plan.hosts.size(); ++i) {
    const BusyGpus busy = busy_of ? busy_of(plan.hosts[i]) : BusyGpus{};
    plan.jobs.push_back(
        describe_host(config, plan, i, hello_of(plan.hosts[i]), facts, exported, busy));
  }
}

JobPlan plan_job(const LaunchConfig &config, const std::vector<HostSpec> &mentions,
                 const BareSlots &bare_slots, const HelloOf &hello_of, const JobFacts &facts,
                 const EnvironmentChanges &exported, const BusyGpusOf &busy_of) {
  JobPlan plan = place_job(config, mentions, bare_slots);
  describe_jobs(config, plan, hello_of, facts, exported, busy_of);
  return plan;
}

}  // namespace perseus::launch

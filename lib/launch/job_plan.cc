#include "lib/launch/job_plan.h"

#include "lib/launch/errors.h"
#include "lib/launch/host_list_parser.h"
#include "lib/launch/hostfile_parser.h"

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
  const auto devices =
      allot_gpus(config.gpu_bind, gpus, static_cast<int>(local_ranks.size()), job.host_label);
  for (size_t i = 0; i < local_ranks.size(); ++i) {
    RankLaunch launch{local_ranks[i], exported};
    const EnvironmentChanges own = rank_environment(plan.placement, local_ranks[i], facts);
    launch.environment.insert(launch.environment.end(), own.begin(), own.end());
    if (devices[i]) launch.environment.emplace_back("CUDA_VISIBLE_DEVICES", *devices[i]);
    if (local_ranks[i] == 0) job.stdin_rank = 0;
    job.ranks.push_back(std::move(launch));
  }
  return job;
}

void check_variable_name(const std::string &name, const std::string &written) {
  if (name.empty() || name.find_first_of("=\0", 0, 2) != std::string::npos) {
    throw InputError("-x '" + written +
                     "': expected a variable name, as in -x NAME or -x NAME=value");
  }
}

}  // namespace

std::vector<HostSpec> host_mentions(const LaunchConfig &config) {
  if (!config.host_lists.empty() && !config.hostfile.empty()) {
    throw InputError("both -H and -hostfile " + config.hostfile + " name hosts; give one of them");
  }
  std::vector<HostSpec> mentions;
  for (const std::string &list : config.host_lists) {
    for (HostSpec &spec : parse_host_list(list)) mentions.push_back(std::move(spec));
  }
  if (!config.hostfile.empty()) mentions = read_hostfile(config.hostfile);
  if (mentions.empty()) mentions.push_back(HostSpec{"", "localhost", {}, {}, "default"});
  return mentions;
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

JobPlan plan_job(const LaunchConfig &config, const std::vector<HostSpec> &mentions,
                 const BareSlots &bare_slots,
                 const std::function<const Hello &(const Host &)> &hello_of, const JobFacts &facts,
                 const EnvironmentChanges &exported, const BusyGpusOf &busy_of) {
  JobPlan plan;
  plan.hosts = merge_hosts(mentions, bare_slots);
  std::vector<PlacementHost> capacity;
  for (const Host &host : plan.hosts) capacity.push_back({host.slots, host.max_slots});
  plan.placement =
      place_ranks(capacity, {config.np, config.npernode, config.map_by, config.oversubscribe});
  for (size_t i = 0; i < plan.hosts.size(); ++i) {
    const BusyGpus busy = busy_of ? busy_of(plan.hosts[i]) : BusyGpus{};
    plan.jobs.push_back(
        describe_host(config, plan, i, hello_of(plan.hosts[i]), facts, exported, busy));
  }
  return plan;
}

}  // namespace perseus::launch

#include "lib/launch/launcher/checker.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

#include "lib/launch/errors.h"
#include "lib/launch/launcher/check_report.h"
#include "lib/launch/planning/job_plan.h"
#include "lib/launch/remote/agent_factory.h"

namespace perseus::launch {

namespace {

// One entry per distinct host, in order of first mention: its agent and what was found there.
struct Target {
  ReachedAgent agent;
  HostFindings found;
};

// Every host's agent, started at once; a host that fails gets its error in its findings.
std::vector<Target> reach(const LaunchConfig &config, const std::vector<HostSpec> &mentions) {
  std::vector<Target> targets;
  for (ReachedAgent &agent : reach_agents(mentions, config, Failures::kRecord)) {
    HostFindings found{agent.spec.host, agent.error, "", "", 0, std::nullopt};
    if (agent.hello) {
      found.agent_version = agent.hello->version;
      found.hostname = agent.hello->hostname;
    }
    targets.push_back(Target{std::move(agent), found});
  }
  return targets;
}

// Ranks per host as the launch would place them; returns the key (user@host) of rank 0's host.
// A host that could not be reached counts as one without GPUs (its bare mentions 1 slot), so
// that the others still show what they would run.
std::string place(const LaunchConfig &config, const std::vector<HostSpec> &mentions,
                  std::vector<Target> &targets) {
  static const Hello kUnreached;
  const auto hello_of = [&](const std::string &user, const std::string &host) -> const Hello & {
    const std::string key = host_key(user, host);
    const Target &target = *std::find_if(targets.begin(), targets.end(), [&](const Target &t) {
      return host_key(t.agent.spec.user, t.agent.spec.host) == key;
    });
    return target.agent.hello ? *target.agent.hello : kUnreached;
  };
  const JobPlan plan = plan_job(
      config, mentions, slots_from_hellos([&](const HostSpec &s) -> const Hello & {
        return hello_of(s.user, s.host);
      }),
      [&](const Host &h) -> const Hello & { return hello_of(h.user, h.host); }, JobFacts{}, {});
  for (size_t i = 0; i < plan.jobs.size(); ++i) {
    targets[i].found.ranks = static_cast<int>(plan.jobs[i].ranks.size());
  }
  const HostSpec &rank0 =
      targets[static_cast<size_t>(plan.placement.ranks[0].host_index)].agent.spec;
  return host_key(rank0.user, rank0.host);
}

// What --check asks a reached host: its GPUs, and --master-port on rank 0's host (on every host
// when rank 0's is not known).
CheckRequest request_for(const LaunchConfig &config, const Target &t,
                         const std::string &rank0_host) {
  CheckRequest request{{}, true};
  if (config.master_port &&
      (rank0_host.empty() || rank0_host == host_key(t.agent.spec.user, t.agent.spec.host))) {
    request.ports.push_back(config.master_port);
  }
  return request;
}

}  // namespace

int run_check(const LaunchConfig &config) {
  const std::vector<HostSpec> mentions = host_mentions(config);
  std::vector<Target> targets = reach(config, mentions);
  std::vector<std::string> placement_problems;
  std::string rank0_host;
  const bool all_reached = std::all_of(targets.begin(), targets.end(),
                                       [](const Target &t) { return t.agent.hello.has_value(); });
  try {
    rank0_host = place(config, mentions, targets);
  } catch (const std::exception &error) {
    // Without every host's slots a failed placement may be the unreached hosts' doing.
    if (all_reached) {
      placement_problems.push_back(std::string("the job cannot be placed: ") + error.what());
    }
  }
  // Every host checks at once; a host that fails gets its error in its findings.
  for (Target &t : targets) {
    if (t.agent.hello) send_check(*t.agent.link, request_for(config, t, rank0_host));
  }
  const long long deadline = monotonic_ms() + kAgentAnswerMs;
  for (Target &t : targets) {
    if (!t.agent.hello) continue;
    try {
      t.found.report = check_report(*t.agent.link, deadline);
    } catch (const std::exception &error) {
      t.found.error = without_host_prefix(error.what(), t.agent.spec.host);
    }
  }
  std::vector<HostFindings> findings;
  for (const Target &t : targets) findings.push_back(t.found);
  CheckVerdict verdict = judge(findings, config.gpu_busy_threshold_mib);
  verdict.blockers.insert(verdict.blockers.begin(), placement_problems.begin(),
                          placement_problems.end());
  const std::string text =
      config.json ? render_json(findings, verdict, config.gpu_busy_threshold_mib)
                            .dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
                        "\n"
                  : render_table(findings, verdict, config.gpu_busy_threshold_mib);
  fputs(text.c_str(), stdout);
  return verdict.can_start() ? kExitSuccess : kExitLaunchFailure;
}

}  // namespace perseus::launch

#include "lib/launch/launcher/launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include <spdlog/spdlog.h>

#include "lib/launch/agent/host_check.h"
#include "lib/launch/errors.h"
#include "lib/launch/launcher/check_report.h"
#include "lib/launch/launcher/host_discovery_script.h"
#include "lib/launch/launcher/output_router.h"
#include "lib/launch/launcher/output_sink.h"
#include "lib/launch/local_host.h"
#include "lib/launch/log.h"
#include "lib/launch/planning/elastic_world.h"
#include "lib/launch/planning/host_list_parser.h"
#include "lib/launch/planning/host_merge.h"
#include "lib/launch/planning/hostfile_parser.h"
#include "lib/launch/planning/job_plan.h"
#include "lib/launch/protocol/heartbeat.h"
#include "lib/launch/remote/agent_factory.h"
#include "lib/launch/remote/agent_link.h"
#include "lib/rendezvous/job_contract.h"
#include "lib/rendezvous/server.h"
#include "perseus/config.h"

namespace perseus::launch {

namespace {

// Elastic mode: how often the discovery script runs while a round runs (horovodrun: 1 s).
constexpr int kDiscoveryIntervalMs = 1000;
// Elastic mode: how often it runs while the job waits for enough hosts.
constexpr int kDiscoveryWaitMs = 1000;

// How long agents get, beyond the grace, to report that everything has ended.
constexpr int kShutdownSlackMs = 10000;
// Stdin bytes sent to rank 0 but not yet written by it; past this, perseusrun stops reading.
constexpr size_t kStdinWindow = 1u << 20;
// Output queued for perseusrun's stdout/stderr: past kPauseAt the agents stop reading their
// ranks' pipes, below kResumeAt they read on.
constexpr size_t kPauseAt = 4u << 20;
constexpr size_t kResumeAt = 1u << 20;
// After the job has ended, how long perseusrun's stdout/stderr may take no output at all before
// the rest is dropped (and the loss said). A reader that keeps reading gets everything.
constexpr int kOutputDrainMs = 2000;
// How long an agent whose connection closed unexpectedly is given to exit, to say how it ended.
constexpr int kAgentEndWaitMs = 5000;

// Where a build tree keeps the `perseus` package, from the build folder: a link into the source
// tree that CMake makes (cmake/GeneratedConfig.cmake), as an installation keeps a copy.
constexpr const char *kBuildTreePackage = "lib/framework_shims";

// The folders that may hold the `perseus` package of the perseusrun in `dir`, nearest first:
// an installation's <prefix>/PERSEUS_INSTALL_PYTHONDIR (cmake --install, the .deb), a virtual
// environment's <prefix>/lib/python3.X/site-packages (pip install), then a build tree's
// (perseusrun in <build>/apps/perseusrun).
std::vector<std::filesystem::path> package_candidates(const std::filesystem::path &dir) {
  const std::filesystem::path prefix = dir.parent_path();
  std::vector<std::filesystem::path> found{prefix / PERSEUS_INSTALL_PYTHONDIR};
  std::error_code error;
  for (const auto &entry : std::filesystem::directory_iterator(prefix / "lib", error)) {
    if (entry.path().filename().string().rfind("python3", 0) == 0) {
      found.push_back(entry.path() / "site-packages");
    }
  }
  found.push_back(dir / "../.." / kBuildTreePackage);
  return found;
}

// Where this perseusrun's libperseus and `perseus` package are, so that `import perseus` works
// in ranks without help, found from perseusrun's own path (/proc/self/exe): an installation
// (<prefix>/bin/perseusrun) first, else the build tree it was built in
// (build/apps/perseusrun/perseusrun beside build/lib/comm/libperseus.so and
// build/lib/framework_shims, the package's link into the source tree). The library that came with
// the package (perseus/lib/libperseus.so) is preferred; the user's PERSEUS_LIBRARY wins over all.
// The package directory goes in front of the user's PYTHONPATH.
void find_shims(JobFacts &facts) {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return;
  const std::filesystem::path dir = self.parent_path();
  std::filesystem::path package;
  for (const auto &candidate : package_candidates(dir)) {
    if (std::filesystem::exists(candidate / "perseus/__init__.py", error)) {  // the package
      package = std::filesystem::weakly_canonical(candidate, error);
      const char *user = getenv("PYTHONPATH");
      facts.python_path = package.string() + (user && *user ? std::string(":") + user : "");
      break;
    }
  }
  const char *library = getenv(contract::kLibrary);
  if (library && *library) {
    facts.library = library;
    return;
  }
  std::vector<std::filesystem::path> libraries{
      dir / ".." / PERSEUS_INSTALL_LIBDIR / "libperseus.so.0",
      dir / "../.." / contract::kBuildTreeLibrary};
  if (!package.empty()) libraries.insert(libraries.begin(), package / contract::kPackagedLibrary);
  for (const auto &candidate : libraries) {
    if (std::filesystem::exists(candidate, error)) {
      facts.library = std::filesystem::absolute(candidate, error).lexically_normal().string();
      break;
    }
  }
}

std::string job_id() {
  std::random_device device;
  char text[17];
  snprintf(text, sizeof text, "%08x%08x", device(), device());
  return text;
}

std::string signal_name(int signal) {
  const char *abbrev = sigabbrev_np(signal);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signal);
}

// "rank 2 (host h, pid 42) exited with code 9" or "... was killed by signal 9 (SIGKILL)".
std::string describe_exit(const RankExited &exited, const std::string &host) {
  const std::string who = "rank " + std::to_string(exited.rank) + " (host " + host + ", pid " +
                          std::to_string(exited.pid) + ")";
  if (!exited.signal) return who + " exited with code " + std::to_string(exited.exit_code);
  return who + " was killed by signal " + std::to_string(exited.signal) + " (" +
         signal_name(exited.signal) + ")";
}

// What one run of --host-discovery-script gave: its hosts, or why it gave none.
struct Discovered {
  std::vector<HostSpec> hosts;
  std::string problem;  // empty: it ran and printed hosts (or none)
};

Discovered run_discovery(const std::string &script) {
  Discovered found;
  try {
    found.hosts = discover_hosts(script);
  } catch (const std::exception &error) {
    found.problem = error.what();
  }
  return found;
}

// How many ranks the hosts hold: -npernode on each, else their slots.
long long slot_room(const std::vector<Host> &hosts, int npernode) {
  long long room = 0;
  for (const Host &host : hosts) room += npernode ? npernode : host.slots;
  return room;
}

// One round of a job: the first, or a restart of every rank after a failure (--max-restarts).
struct Round {
  int restart = 0;                   // 0: the first round
  std::set<std::string> lost_hosts;  // host keys lost in earlier rounds: left out
  long long deadline_ms = 0;         // --timeout's end, the same for every round; 0: none
  // Elastic mode (--host-discovery-script): the round's hosts and ranks, chosen beforehand;
  // the script, which runs on a thread of its own every kDiscoveryIntervalMs while the round
  // runs (so that a slow one never holds up the poll loop and its heartbeats); and what ends the
  // round when the hosts it printed (or its failure) call for it: the reason, or nothing, given
  // the round's host keys and number of ranks.
  std::vector<HostSpec> mentions;
  int np = 0;
  std::string discovery_script;
  std::function<std::optional<std::string>(const Discovered &, const std::set<std::string> &,
                                           size_t)>
      resize_check;
  // Elastic mode, worlds made in place (Launcher::regroup): the usable hosts the script lists
  // now (nullopt when it fails), and the record of a host's failure (blacklisting, as between
  // rounds).
  std::function<std::optional<std::vector<HostSpec>>()> usable_hosts;
  std::function<void(const std::string &host_key, bool lost)> record_failure;
  int resets_before = 0;  // restarts and worlds made in place in earlier rounds (--reset-limit)
};

// How a round ended: what run_launcher needs to decide on a restart and to report it.
struct RoundEnd {
  int exit_code = kExitSuccess;
  // A rank failed or a host was lost, and nothing else ended the job (a signal, --timeout, an
  // agent's error such as a program that cannot be started): another round may do better.
  bool restartable = false;
  std::string why;                      // the failure, as said
  std::vector<std::string> lost_hosts;  // host keys lost in this round
  std::string lost_names;               // the same, as host names, for messages
  std::string failed_host;              // the host key of the first failing rank, if one failed
  bool resized = false;                 // ended because the discovered hosts changed
  long long failed_at_ms = 0;           // when the failure was seen
  long long started_at_ms = 0;          // when every rank of the round had started
  int worlds_in_place = 0;              // new worlds made in place during the round
};

class Launcher {
 public:
  Launcher(const LaunchConfig &config, Round round) : config_(config), round_(std::move(round)) {}
  RoundEnd run();

 private:
  struct Agent {
    std::unique_ptr<AgentLink> link;
    std::optional<Hello> hello;
    bool done = false;
    Heartbeat heartbeat;  // the agent's, while the job runs
  };

  void start_agents(const std::vector<HostSpec> &mentions);
  std::string master_address(const Host &rank0_host) const;
  std::string own_address() const;
  void plan(const std::vector<HostSpec> &mentions);
  std::map<std::string, BusyGpus> preflight(const Host &rank0_host);
  void display_map() const;
  void loop();
  void poll_once();
  void handle_frames(Agent &agent);
  void handle_frame(Agent &agent, const Frame &frame);
  void rank_exited(const Agent &agent, const RankExited &exited);
  void agent_ended(Agent &agent);
  void start_heartbeats();
  void watch_agents();
  void agent_lost(Agent &agent);
  void publish_lost_ranks(const Agent &agent, const std::string &why);
  void publish_exit(int rank, const std::string &note);
  void handle_signals();
  void forward_stdin();
  void end_job(double grace_seconds);
  void report_failures();
  void say(const std::string &message);
  void hold_back_output();
  void drain_output();
  void print_summary();
  bool all_done() const;
  Agent *agent_of_rank_zero();

  void note_failure(const std::string &why);
  void note_lost_host(const Agent &agent);
  void check_hosts();
  std::vector<HostSpec> round_mentions();
  void fit_to_hosts(const std::vector<HostSpec> &mentions, const BareSlots &bare_slots);

  // Elastic mode: every process has an id for the job (the agents' rank number, its output
  // tag); its place in the current world may differ (job_contract.h, "Elastic jobs").
  struct Worker {
    std::string host;  // host key
    std::string name;  // host name, for messages
    int slot = 0;      // its local rank when started, which chose its GPU
    int rank = -1;     // in the current world; -1: not in it
    bool alive = true;
    bool fresh = false;  // started for a world made in place (it declares itself when it joins)
  };
  // A world made in place: when and why, and when every member had joined it.
  struct InPlaceReset {
    long long at_ms = 0;
    std::string why;
    int world = 0;
    int size = 0;
    long long joined_ms = 0;
  };
  bool elastic() const { return !round_.discovery_script.empty(); }
  void start_world();
  void publish_place(int world, int id, const RankPlace &place, int size);
  bool survivors_ready() const;
  bool continue_in_place(const std::string &why, const std::string &failed_host, bool lost);
  bool regroup(const std::string &why, const std::vector<HostSpec> &specs, bool end_world);
  JobDescription host_template(const HostSpec &spec);
  void watch_joins();
  void watch_broken_joins();
  std::string host_key_of(int id) const;
  std::string host_name_of(int id) const;
  std::string world_keys() const;
  std::string key_of(const Agent &agent) const;
  void print_in_place_resets() const;

  LaunchConfig config_;  // a copy: a restart on fewer hosts runs fewer ranks
  const Round round_;
  std::map<int, Worker> workers_;
  int world_ = 0;
  int next_worker_ = 0;
  long long hosts_updates_ = 0;
  JobFacts facts_;
  EnvironmentChanges exported_;
  std::set<std::string> leaving_;  // hosts whose ranks were ended on purpose
  std::vector<InPlaceReset> in_place_;
  bool finishing_ = false;               // a rank of the current world has finished
  long long first_failure_seen_ms_ = 0;  // elastic mode: the first of the failures gathered
  static constexpr long long kSettleMs = 200;
  UniqueFd signals_;
  std::map<std::string, Agent> agents_;  // by host key
  std::vector<std::string> agent_order_;
  JobPlan plan_;
  rendezvous::Secret secret_ = rendezvous::random_secret();
  std::unique_ptr<rendezvous::Server> rendezvous_;
  bool first_exit_published_ = false;
  std::set<int> ended_ranks_;
  std::unique_ptr<OutputRouter> output_;
  std::vector<RankExited> new_failures_;
  std::optional<RankExited> failure_;
  std::optional<AgentError> agent_error_;
  int received_signal_ = 0;
  bool timed_out_ = false;
  bool ending_ = false;
  long long give_up_at_ms_ = 0;
  long long deadline_ms_ = 0;
  bool stdin_open_ = false;
  size_t stdin_in_flight_ = 0;
  bool output_paused_ = false;  // the agents were told to stop reading rank output
  // For restarts: what failed, which hosts were lost, and when.
  bool fatal_ = false;  // an agent's own error (kError): no restart helps
  std::string why_;
  std::vector<std::string> lost_hosts_;
  std::string lost_names_;
  long long failed_at_ms_ = 0;
  std::string failed_host_;
  bool resized_ = false;
  long long next_discovery_ms_ = 0;
  std::future<Discovered> discovery_;  // the discovery script's run in progress, if one is
  size_t started_ranks_ = 0;
  long long started_at_ms_ = 0;
};

UniqueFd block_signals() {
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&signals, s);
  sigprocmask(SIG_BLOCK, &signals, nullptr);
  UniqueFd fd(signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!fd.valid()) throw_system_error("signalfd", "");
  return fd;
}

RoundEnd Launcher::run() {
  init_logging(config_.verbose, "perseusrun");
  const std::vector<HostSpec> mentions = round_mentions();
  signals_ = block_signals();
  start_agents(mentions);
  plan(mentions);
  if (config_.display_map) display_map();
  output_ = std::make_unique<OutputRouter>(plan_.placement.size(), config_.output_directory,
                                           round_.restart > 0);
  if (elastic()) start_world();
  for (size_t i = 0; i < plan_.hosts.size(); ++i) {
    const Host &host = plan_.hosts[i];
    agents_.at(host_key(host.user, host.host))
        .link->channel()
        .send(FrameType::kJob, encode(plan_.jobs[i]));
  }
  // Reading a terminal from the background would stop perseusrun (SIGTTIN).
  stdin_open_ = !isatty(STDIN_FILENO) || tcgetpgrp(STDIN_FILENO) == getpgrp();
  deadline_ms_ = round_.deadline_ms;
  loop();
  drain_output();
  print_summary();
  print_in_place_resets();
  RoundEnd end;
  end.why = why_;
  end.lost_hosts = lost_hosts_;
  end.lost_names = lost_names_;
  end.failed_host = failed_host_;
  end.resized = resized_;
  end.failed_at_ms = failed_at_ms_;
  end.started_at_ms = started_at_ms_;
  end.worlds_in_place = static_cast<int>(in_place_.size());
  end.restartable = !received_signal_ && !timed_out_ &&
                    (resized_ || (!fatal_ && (failure_ || !lost_hosts_.empty())));
  if (received_signal_) {
    end.exit_code = 128 + received_signal_;
  } else if (timed_out_) {
    end.exit_code = kExitTimeout;
  } else if (agent_error_) {
    end.exit_code = agent_error_->exit_code;
  } else if (failure_) {
    end.exit_code = failure_->signal ? 128 + failure_->signal : failure_->exit_code;
  }
  return end;
}

// The hosts of this round: every mention but those lost in earlier rounds.
std::vector<HostSpec> Launcher::round_mentions() {
  if (!round_.mentions.empty()) return round_.mentions;
  std::vector<HostSpec> mentions = host_mentions(config_);
  if (round_.lost_hosts.empty()) return mentions;
  mentions.erase(std::remove_if(mentions.begin(), mentions.end(),
                                [this](const HostSpec &spec) {
                                  return round_.lost_hosts.count(host_key(spec.user, spec.host));
                                }),
                 mentions.end());
  if (mentions.empty())
    throw LaunchError("no host is left to restart the job on: every host was lost");
  return mentions;
}

// A restart after hosts were lost runs as many ranks as the hosts left hold (never more than
// -np, never fewer than --min-np), as torchrun's elastic agent continues with the nodes left.
void Launcher::fit_to_hosts(const std::vector<HostSpec> &mentions, const BareSlots &bare_slots) {
  if (round_.np > 0) {
    config_.np = round_.np;
    return;
  }
  if (round_.lost_hosts.empty() || config_.oversubscribe) return;
  const std::vector<Host> hosts = merge_hosts(mentions, bare_slots);
  const long long room = slot_room(hosts, config_.npernode);
  const long long wanted = config_.np ? config_.np : room;
  const long long ranks = std::min(wanted, room);
  if (ranks < std::max(1, config_.min_np)) {
    throw LaunchError("only " + std::to_string(ranks) + " ranks fit on the " +
                      std::to_string(hosts.size()) + " hosts left, fewer than --min-np " +
                      std::to_string(config_.min_np) + "; not restarting");
  }
  if (config_.np && ranks < config_.np) {
    say("perseusrun: " + std::to_string(ranks) + " ranks fit on the hosts left (-np " +
        std::to_string(config_.np) + "): the job goes on with " + std::to_string(ranks));
  }
  config_.np = static_cast<int>(ranks);
}

// Elastic mode: when the discovery script's hosts have changed so that the job should run on
// another set of hosts, the round ends (the ranks get SIGTERM, as at any end) and another starts.
void Launcher::check_hosts() {
  const long long now = monotonic_ms();
  if (!discovery_.valid()) {
    if (now < next_discovery_ms_) return;
    discovery_ = std::async(std::launch::async, run_discovery, round_.discovery_script);
    return;
  }
  if (discovery_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
  const Discovered found = discovery_.get();
  next_discovery_ms_ = now + kDiscoveryIntervalMs;
  std::set<std::string> keys(agent_order_.begin(), agent_order_.end());
  size_t ranks = static_cast<size_t>(plan_.placement.size());
  if (elastic()) {  // the current world's hosts and size (it may have changed in place)
    keys.clear();
    ranks = 0;
    for (const auto &[id, worker] : workers_) {
      if (worker.alive && worker.rank >= 0) {
        keys.insert(worker.host);
        ranks += 1;
      }
    }
  }
  const std::optional<std::string> reason = round_.resize_check(found, keys, ranks);
  if (!reason) return;
  if (survivors_ready() && round_.usable_hosts) {
    // Every process can join a new world in place: added hosts join at the survivors' next
    // commit (the world goes on until then); hosts gone end their ranks and the world now.
    if (const std::optional<std::vector<HostSpec>> specs = round_.usable_hosts()) {
      std::set<std::string> listed;
      for (const HostSpec &spec : *specs) listed.insert(host_key(spec.user, spec.host));
      const bool removed = std::any_of(workers_.begin(), workers_.end(), [&](const auto &entry) {
        return entry.second.alive && entry.second.rank >= 0 && !listed.count(entry.second.host);
      });
      if (regroup(*reason, *specs, removed)) return;
    }
  }
  resized_ = true;
  note_failure(*reason);
  say("perseusrun: " + *reason + "; ending every rank to restart on the new set of hosts");
  end_job(config_.kill_grace_seconds);
}

void Launcher::note_lost_host(const Agent &agent) {
  for (const auto &[key, candidate] : agents_) {
    if (&candidate != &agent) continue;
    lost_hosts_.push_back(key);
    lost_names_ += (lost_names_.empty() ? "" : ", ") + agent.link->host();
  }
}

void Launcher::note_failure(const std::string &why) {
  if (failed_at_ms_) return;
  failed_at_ms_ = monotonic_ms();
  why_ = why;
}

void Launcher::start_agents(const std::vector<HostSpec> &mentions) {
  for (ReachedAgent &reached : reach_agents(mentions, config_, Failures::kThrow)) {
    const std::string key = host_key(reached.spec.user, reached.spec.host);
    Agent &agent = agents_[key];
    agent.link = std::move(reached.link);
    agent.hello = std::move(reached.hello);
    agent_order_.push_back(key);
  }
}

void Launcher::plan(const std::vector<HostSpec> &mentions) {
  const auto hello_of = [this](const Host &host) -> const Hello & {
    return *agents_.at(host_key(host.user, host.host)).hello;
  };
  const BareSlots bare_slots = slots_from_hellos([this](const HostSpec &spec) -> const Hello & {
    return *agents_.at(host_key(spec.user, spec.host)).hello;
  });
  std::vector<std::string> warnings;
  const EnvironmentChanges exported = exported_environment(
      config_,
      [](const std::string &name) -> std::optional<std::string> {
        const char *value = getenv(name.c_str());
        return value ? std::optional<std::string>(value) : std::nullopt;
      },
      warnings);
  for (const std::string &warning : warnings) {
    fprintf(stderr, "perseusrun: warning: %s\n", warning.c_str());
  }
  // MASTER_ADDR and MASTER_PORT depend on rank 0's host, and which GPUs are free on the
  // preflight: place the ranks first, then describe each host's job with the facts.
  JobFacts facts;
  facts.job_id = job_id();
  find_shims(facts);
  facts.secret.assign(reinterpret_cast<const char *>(secret_.data()), secret_.size());
  facts.restart_count = round_.restart;
  facts.max_restarts = std::max(0, config_.max_restarts);
  fit_to_hosts(mentions, bare_slots);
  plan_ = place_job(config_, mentions, bare_slots);
  const Host &rank0_host = plan_.hosts[static_cast<size_t>(plan_.placement.ranks[0].host_index)];
  const std::map<std::string, BusyGpus> busy = preflight(rank0_host);
  facts.master_addr = master_address(rank0_host);
  rendezvous_ = std::make_unique<rendezvous::Server>(secret_, own_address());
  facts.rendezvous_addr = rendezvous_->address();
  facts.rendezvous_port = rendezvous_->port();
  facts.master_port = config_.master_port ? config_.master_port : hello_of(rank0_host).free_port;
  describe_jobs(config_, plan_, hello_of, facts, exported, [&](const Host &host) {
    const auto found = busy.find(host_key(host.user, host.host));
    return found == busy.end() ? BusyGpus{} : found->second;
  });
  facts_ = facts;
  exported_ = exported;
  spdlog::debug("job {}: {} ranks on {} nodes, MASTER_ADDR {} MASTER_PORT {}", facts.job_id,
                plan_.placement.size(), plan_.placement.nodes.size(), facts.master_addr,
                facts.master_port);
}

// The quick part of --check, before any rank starts: a --master-port taken on rank 0's host
// stops the launch; GPUs that other processes hold are left out of the allotment.
std::map<std::string, BusyGpus> Launcher::preflight(const Host &rank0_host) {
  std::map<std::string, BusyGpus> busy;
  if (!config_.preflight) return busy;
  const std::string rank0_key = host_key(rank0_host.user, rank0_host.host);
  std::map<std::string, CheckRequest> requests;
  for (const std::string &key : agent_order_) {
    CheckRequest request{{}, config_.gpu_bind != GpuBind::kNone};
    if (key == rank0_key && config_.master_port) request.ports.push_back(config_.master_port);
    if (!request.ports.empty() || request.gpus) requests[key] = request;
  }
  for (const auto &[key, request] : requests) send_check(*agents_.at(key).link, request);
  const long long deadline = monotonic_ms() + kAgentAnswerMs;
  for (const auto &[key, request] : requests) {
    AgentLink &link = *agents_.at(key).link;
    const CheckReport report = check_report(link, deadline);
    for (const PortUse &use : report.ports) {
      if (use.in_use) {
        throw LaunchError("host " + link.host() + ": " + describe(use) +
                          "; stop that process, or pick another port with --master-port (or "
                          "leave it out to get a free one)");
      }
    }
    for (const GpuInfo &gpu : report.gpus.gpus) {
      if (!gpu_is_busy(gpu, config_.gpu_busy_threshold_mib)) continue;
      busy[key].ids.insert(busy[key].ids.end(), {std::to_string(gpu.index), gpu.uuid});
      busy[key].detail = describe_busy_gpus(report.gpus, config_.gpu_busy_threshold_mib);
    }
  }
  return busy;
}

std::string Launcher::master_address(const Host &rank0_host) const {
  const AgentLink &rank0 = *agents_.at(host_key(rank0_host.user, rank0_host.host)).link;
  if (!is_local_host(rank0_host.host)) {
    return rank0.peer_address().empty() ? rank0_host.host : rank0.peer_address();
  }
  return own_address();
}

// This machine's address as every host reaches it: --addr, --iface, the address of the SSH
// connections, the source address of the route to the first other host (its address as Slurm
// knows it, for a node reached through srun), or loopback when the job runs here alone.
std::string Launcher::own_address() const {
  if (!config_.ssh.address.empty()) return config_.ssh.address;
  if (!config_.ssh.interface.empty()) {
    const std::string address = interface_address(config_.ssh.interface);
    if (address.empty()) {
      throw InputError("--iface " + config_.ssh.interface +
                       ": no such interface with an address on this machine (see 'ip addr')");
    }
    return address;
  }
  for (const auto &[key, agent] : agents_) {
    if (!agent.link->local_address().empty()) return agent.link->local_address();
  }
  for (const auto &[key, agent] : agents_) {
    if (!is_local_host(agent.link->host())) {
      const std::string peer = agent.link->peer_address();
      const std::string address = route_source_address(peer.empty() ? agent.link->host() : peer);
      if (!address.empty()) return address;
    }
  }
  return "127.0.0.1";
}

void Launcher::display_map() const {
  for (const RankPlace &place : plan_.placement.ranks) {
    fprintf(stderr, "perseusrun: rank %d on %s (node %d, local rank %d of %d)\n", place.rank,
            plan_.hosts[static_cast<size_t>(place.host_index)].host.c_str(), place.node_rank,
            place.local_rank, place.local_size);
  }
}

void Launcher::loop() {
  start_heartbeats();
  while (!all_done()) {
    poll_once();
    watch_agents();
    report_failures();
    output_->flush();
    hold_back_output();
    const long long now = monotonic_ms();
    if (deadline_ms_ && now >= deadline_ms_ && !ending_) {
      timed_out_ = true;
      char message[128];
      snprintf(message, sizeof message,
               "perseusrun: error: the job ran past --timeout %g s; ending it",
               config_.timeout_seconds);
      say(message);
      end_job(config_.kill_grace_seconds);
    }
    // (Not while failures wait to be answered: the new world will take the hosts in.)
    if (round_.resize_check && !ending_ && !finishing_ && new_failures_.empty()) check_hosts();
    if (elastic() && !ending_) {
      watch_joins();
      watch_broken_joins();
      // An elastic agent stays for new ranks: the job ends when none of its processes is left.
      if (std::none_of(workers_.begin(), workers_.end(),
                       [](const auto &entry) { return entry.second.alive; })) {
        end_job(config_.kill_grace_seconds);
      }
    }
    if (ending_ && now >= give_up_at_ms_) {
      say("perseusrun: error: agents did not end the job in time; killing them");
      for (auto &[key, agent] : agents_) agent.link->kill();
      return;
    }
  }
}

void Launcher::poll_once() {
  std::vector<pollfd> fds{{signals_.get(), POLLIN, 0}};
  const bool want_stdin = stdin_open_ && stdin_in_flight_ < kStdinWindow && agent_of_rank_zero();
  fds.push_back({want_stdin ? STDIN_FILENO : -1, POLLIN, 0});
  for (const std::string &key : agent_order_) {
    Agent &agent = agents_.at(key);
    FrameChannel &channel = agent.link->channel();
    fds.push_back({agent.done ? -1 : channel.read_fd(), POLLIN, 0});
    fds.push_back({!agent.done && channel.wants_write() ? channel.write_fd() : -1, POLLOUT, 0});
  }
  for (int fd : output_->poll_fds()) fds.push_back({fd, POLLOUT, 0});
  if (poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) throw_system_error("poll", "");
  if (fds[0].revents) handle_signals();
  if (fds[1].revents) forward_stdin();
  for (size_t i = 0; i < agent_order_.size(); ++i) {
    Agent &agent = agents_.at(agent_order_[i]);
    if (fds[2 + 2 * i].revents) handle_frames(agent);
    if (!agent.done && !agent.link->channel().flush()) agent_ended(agent);
  }
}

void Launcher::handle_frames(Agent &agent) {
  std::vector<Frame> frames;
  bool open = true;
  try {
    open = agent.link->channel().read_available(frames);
  } catch (const LaunchError &error) {
    say(std::string("perseusrun: error: ") + error.what());
    open = false;
  }
  if (!frames.empty()) agent.heartbeat.heard(monotonic_ms());
  for (const Frame &frame : frames) handle_frame(agent, frame);
  if (!open && !agent.done) agent_ended(agent);
}

void Launcher::handle_frame(Agent &agent, const Frame &frame) {
  const std::string &peer = agent.link->channel().peer();
  switch (frame.type) {
    case FrameType::kOutput:
      output_->write(decode_output(frame.payload, peer));
      break;
    case FrameType::kExited:
      rank_exited(agent, decode_exited(frame.payload, peer));
      break;
    case FrameType::kStdinAck:
      stdin_in_flight_ -= std::min(stdin_in_flight_, decode_count(frame.payload, peer));
      break;
    case FrameType::kError:
      if (!agent_error_ && !ending_) {
        agent_error_ = decode_error(frame.payload, peer);
        fatal_ = true;
        say("perseusrun: error: " + agent_error_->message);
      }
      end_job(config_.kill_grace_seconds);
      break;
    case FrameType::kDone:
      spdlog::debug("the agent on {} is done", agent.link->host());
      agent.done = true;
      agent.link->reap(1000);
      break;
    case FrameType::kStarted: {
      const RankStarted started = decode_started(frame.payload, peer);
      spdlog::debug("rank {} started on {} as pid {}", started.rank, agent.link->host(),
                    started.pid);
      if (++started_ranks_ == static_cast<size_t>(plan_.placement.size())) {
        started_at_ms_ = monotonic_ms();
      }
      break;
    }
    default:
      break;
  }
}

void Launcher::rank_exited(const Agent &agent, const RankExited &exited) {
  spdlog::debug("rank {} (pid {}) on {} ended: exit code {}, signal {}", exited.rank, exited.pid,
                agent.link->host(), exited.exit_code, exited.signal);
  if (exited.rank == 0) stdin_open_ = false;
  ended_ranks_.insert(exited.rank);
  if (elastic()) {
    const auto found = workers_.find(exited.rank);
    if (found == workers_.end()) return;
    Worker &worker = found->second;
    worker.alive = false;
    const int rank = worker.rank;
    worker.rank = -1;
    if (rank < 0) return;  // not in the current world: its end changes nothing
    // A rank that finished: the job is ending, and its world changes no more (as Horovod's).
    if (exited.exit_code == 0 && exited.signal == 0) finishing_ = true;
    RankExited in_world = exited;  // its note names its rank in the world, not its id
    in_world.rank = rank;
    publish_exit(rank, describe_exit(in_world, worker.name));
    if ((exited.exit_code != 0 || exited.signal != 0) && !ending_ && !leaving_.count(worker.host)) {
      new_failures_.push_back(exited);
    }
    return;
  }
  if (rendezvous_ && exited.rank >= 0 &&
      static_cast<size_t>(exited.rank) < plan_.placement.ranks.size()) {
    // The ranks that lose a connection to this one read here which peer ended, and how.
    publish_exit(exited.rank, describe_exit(exited, agent.link->host()));
  }
  if ((exited.exit_code != 0 || exited.signal != 0) && !ending_) {
    new_failures_.push_back(exited);
  }
}

// Reports the lowest-numbered rank among those that failed in the last batch, which are the
// failures the job did not cause itself by ending.
void Launcher::report_failures() {
  if (new_failures_.empty()) return;
  // Elastic mode: the ranks of one incident (a host's ranks killed together) end a moment apart;
  // they are gathered for kSettleMs so that one new world answers them all.
  if (elastic() && survivors_ready()) {
    if (!first_failure_seen_ms_) first_failure_seen_ms_ = monotonic_ms();
    if (monotonic_ms() - first_failure_seen_ms_ < kSettleMs) return;
  }
  first_failure_seen_ms_ = 0;
  const RankExited first =
      *std::min_element(new_failures_.begin(), new_failures_.end(),
                        [](const RankExited &a, const RankExited &b) { return a.rank < b.rank; });
  new_failures_.clear();
  const std::string host = host_name_of(first.rank);
  if (elastic() && continue_in_place(describe_exit(first, host), host_key_of(first.rank), false)) {
    return;
  }
  failure_ = first;
  note_failure(describe_exit(first, host));
  if (failed_host_.empty()) failed_host_ = host_key_of(first.rank);
  say("perseusrun: " + describe_exit(first, host) + "; ending the job");
  end_job(config_.kill_grace_seconds);
}

void Launcher::agent_ended(Agent &agent) {
  agent.done = true;
  // Its connection is closed, so its process is ending; a slow end (a sanitizer's report or
  // leak check at exit on a loaded machine) is waited for, so that failure() can say how.
  agent.link->reap(kAgentEndWaitMs);
  const std::string why = agent.link->failure();
  publish_lost_ranks(agent, why.empty() ? "its agent ended unexpectedly" : why);
  if (!ending_ && elastic() &&
      continue_in_place("the agent on " + agent.link->host() + " ended unexpectedly" +
                            (why.empty() ? "" : " (" + why + ")"),
                        key_of(agent), true)) {
    return;
  }
  if (!ending_) {
    note_lost_host(agent);
    note_failure("the agent on " + agent.link->host() + " ended unexpectedly" +
                 (why.empty() ? "" : " (" + why + ")"));
    say("perseusrun: error: the agent on " + agent.link->host() + " ended unexpectedly" +
        (why.empty() ? "" : " (" + why + ")") + "; ending the job");
    agent_error_ = AgentError{"agent ended", kExitLaunchFailure};
    end_job(config_.kill_grace_seconds);
  }
}

// From the job's start on, every agent gets a heartbeat and must send one (heartbeat.h).
void Launcher::start_heartbeats() {
  const HeartbeatTiming timing =
      heartbeat_timing(config_.heartbeat_timeout_seconds, "--heartbeat-timeout");
  for (auto &[key, agent] : agents_) agent.heartbeat = Heartbeat(timing, monotonic_ms());
}

void Launcher::watch_agents() {
  const long long now = monotonic_ms();
  for (const std::string &key : agent_order_) {
    Agent &agent = agents_.at(key);
    if (agent.done) continue;
    if (agent.heartbeat.send_due(now)) agent.link->channel().send(FrameType::kHeartbeat, "");
    if (agent.heartbeat.lost(now)) agent_lost(agent);
  }
}

// An agent silent for the heartbeat timeout: its host is down or cut off (or the agent is
// stopped). Its connection may never close, so it is ended here; the agent ends its ranks by
// itself when it misses the launcher's heartbeats.
void Launcher::agent_lost(Agent &agent) {
  const std::string why = "no message from its agent for " +
                          std::to_string(agent.heartbeat.silence_ms(monotonic_ms()) / 1000) +
                          " s (--heartbeat-timeout " +
                          std::to_string(agent.heartbeat.timing().timeout_ms / 1000) +
                          "): the host is down, or the network to it";
  agent.done = true;
  agent.link->kill();
  agent.link->reap(1000);
  publish_lost_ranks(agent, why);
  if (!ending_ && elastic() &&
      continue_in_place("lost host " + agent.link->host() + ": " + why, key_of(agent), true)) {
    return;
  }
  if (!ending_) {
    note_lost_host(agent);
    note_failure("lost host " + agent.link->host() + ": " + why);
    say("perseusrun: error: lost host " + agent.link->host() + ": " + why + "; ending the job");
    agent_error_ = AgentError{"host lost", kExitLaunchFailure};
    end_job(config_.kill_grace_seconds);
  }
}

// Ranks of a lost host cannot report their end: the ranks that lose a connection to one of them
// read here that it went with its host, so that they blame the host, not one another.
void Launcher::publish_lost_ranks(const Agent &agent, const std::string &why) {
  if (!rendezvous_) return;
  if (elastic()) {
    const std::string key = key_of(agent);
    for (auto &[id, worker] : workers_) {
      if (worker.host != key || !worker.alive) continue;
      worker.alive = false;
      ended_ranks_.insert(id);
      if (worker.rank >= 0) {
        publish_exit(worker.rank, "rank " + std::to_string(worker.rank) + " was lost with host " +
                                      agent.link->host() + " (" +
                                      without_host_prefix(why, agent.link->host()) + ")");
      }
      worker.rank = -1;
    }
    return;
  }
  for (const RankPlace &place : plan_.placement.ranks) {
    const Host &host = plan_.hosts[static_cast<size_t>(place.host_index)];
    if (ended_ranks_.count(place.rank) || &agents_.at(host_key(host.user, host.host)) != &agent) {
      continue;
    }
    const std::string note = "rank " + std::to_string(place.rank) + " was lost with host " +
                             agent.link->host() + " (" +
                             without_host_prefix(why, agent.link->host()) + ")";
    publish_exit(place.rank, note);
    ended_ranks_.insert(place.rank);
  }
}

// How a rank ended, in the store for the ranks still waiting on it (lib/rendezvous/job_contract.h),
// and the first such note under one key too, so that ranks can watch for it cheaply.
void Launcher::publish_exit(int rank, const std::string &note) {
  rendezvous_->publish(world_keys() + contract::exit_key(rank), note);
  if (!first_exit_published_) {
    rendezvous_->publish(world_keys() + contract::kFirstExitKey, note);
    first_exit_published_ = true;
  }
}

void Launcher::handle_signals() {
  signalfd_siginfo info{};
  while (::read(signals_.get(), &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    const int signal = static_cast<int>(info.ssi_signo);
    if (received_signal_) {
      end_job(0);  // a second signal: no more grace
      continue;
    }
    received_signal_ = signal;
    say("perseusrun: got " + signal_name(signal) + "; ending the job (again to kill at once)");
    end_job(config_.kill_grace_seconds);
  }
}

void Launcher::forward_stdin() {
  Agent *agent = agent_of_rank_zero();
  char buffer[64 * 1024];
  const ssize_t n = retry_on_eintr([&] { return ::read(STDIN_FILENO, buffer, sizeof buffer); });
  if (n > 0 && agent) {
    agent->link->channel().send(FrameType::kStdin,
                                std::string_view(buffer, static_cast<size_t>(n)));
    stdin_in_flight_ += static_cast<size_t>(n);
    return;
  }
  stdin_open_ = false;
  if (agent) agent->link->channel().send(FrameType::kStdinEof, "");
}

void Launcher::end_job(double grace_seconds) {
  spdlog::debug("ending the job: SIGTERM to every rank, SIGKILL after {} s", grace_seconds);
  const std::string terminate = encode(Terminate{grace_seconds});
  for (auto &[key, agent] : agents_) {
    if (!agent.done) agent.link->channel().send(FrameType::kTerminate, terminate);
  }
  const long long give_up =
      monotonic_ms() + static_cast<long long>(grace_seconds * 1000) + kShutdownSlackMs;
  give_up_at_ms_ = ending_ ? std::min(give_up_at_ms_, give_up) : give_up;
  ending_ = true;
  stdin_open_ = false;
}

// perseusrun's own messages while the job runs queue behind the ranks' stderr lines, so that
// a stuck stderr never blocks the loop.
void Launcher::say(const std::string &message) {
  if (output_) {
    output_->say(message);
  } else {
    fprintf(stderr, "%s\n", message.c_str());
  }
}

// Back-pressure: while perseusrun's stdout or stderr lag, the agents stop reading their ranks'
// output (the ranks block on their pipes), but every other message still flows.
void Launcher::hold_back_output() {
  const size_t backlog = output_->backlog();
  const bool pause = output_paused_ ? backlog > kResumeAt : backlog > kPauseAt;
  if (pause == output_paused_) return;
  output_paused_ = pause;
  spdlog::debug("{} {} bytes queued for output",
                pause ? "pausing output:" : "resuming output:", backlog);
  for (auto &[key, agent] : agents_) {
    if (!agent.done) {
      agent.link->channel().send(pause ? FrameType::kPauseOutput : FrameType::kResumeOutput, "");
    }
  }
}

// The job has ended: output still queued is written while its destination takes some of it at
// least every kOutputDrainMs (until a signal comes); the rest is dropped, and the loss said.
void Launcher::drain_output() {
  output_->finish();
  long long give_up = monotonic_ms() + kOutputDrainMs;
  for (size_t left = output_->backlog(); left > 0 && monotonic_ms() < give_up;) {
    std::vector<pollfd> fds{{signals_.get(), POLLIN, 0}};
    for (int fd : output_->poll_fds()) fds.push_back({fd, POLLOUT, 0});
    poll(fds.data(), fds.size(), 50);
    if (fds[0].revents) break;
    output_->flush();
    if (output_->backlog() < left) give_up = monotonic_ms() + kOutputDrainMs;
    left = output_->backlog();
  }
  output_->drop();
}

// The last words on stderr: the failing rank and its last lines of stderr (its traceback),
// and output that was lost. Written directly, with what stderr takes in a bounded time.
void Launcher::print_summary() {
  std::string summary;
  if (failure_) {
    const RankExited &first = *failure_;
    const std::string host = host_name_of(first.rank);
    const std::vector<std::string> tail = output_->stderr_tail(first.rank);
    summary += "perseusrun: " + describe_exit(first, host);
    if (tail.empty()) {
      summary += "; it wrote nothing to stderr\n";
    } else {
      summary += "; the last " + std::to_string(tail.size()) + " lines of its stderr:\n";
      for (const std::string &line : tail) summary += "perseusrun: | " + line + "\n";
    }
  }
  const std::string losses = output_->loss_report();
  if (!losses.empty()) summary += "perseusrun: warning: " + losses + "\n";
  if (summary.empty()) return;
  OutputSink sink(STDERR_FILENO, "stderr");
  sink.append(-1, summary);
  const long long give_up = monotonic_ms() + kOutputDrainMs / 2;
  for (sink.flush(); sink.backlog() > 0 && monotonic_ms() < give_up; sink.flush()) {
    pollfd out{sink.poll_fd(), POLLOUT, 0};
    poll(&out, 1, 50);
  }
}

// ---- Elastic mode: worlds made in place (job_contract.h, "Elastic jobs") ----

std::string Launcher::world_keys() const {
  return elastic() ? contract::elastic_prefix(world_) : std::string();
}

std::string Launcher::key_of(const Agent &agent) const {
  for (const auto &[key, candidate] : agents_) {
    if (&candidate == &agent) return key;
  }
  return "";
}

std::string Launcher::host_key_of(int id) const {
  if (elastic()) {
    const auto found = workers_.find(id);
    return found == workers_.end() ? "" : found->second.host;
  }
  const Host &where =
      plan_.hosts[static_cast<size_t>(plan_.placement.ranks[static_cast<size_t>(id)].host_index)];
  return host_key(where.user, where.host);
}

std::string Launcher::host_name_of(int id) const {
  if (elastic()) {
    const auto found = workers_.find(id);
    return found == workers_.end() ? "?" : found->second.name;
  }
  return plan_.hosts[static_cast<size_t>(plan_.placement.ranks[static_cast<size_t>(id)].host_index)]
      .host;
}

// The place of process `id` in `world` (of `size` ranks), for its perseus_init.
void Launcher::publish_place(int world, int id, const RankPlace &place, int size) {
  rendezvous_->publish(
      contract::elastic_place_key(world, id),
      contract::elastic_place_value(place.rank, size, place.local_rank, place.local_size,
                                    place.cross_rank, place.cross_size));
}

// World 0 is the plan's: each process's id is its rank, and every agent stays for new ranks.
void Launcher::start_world() {
  for (size_t i = 0; i < plan_.hosts.size(); ++i) {
    plan_.jobs[i].elastic = true;
    for (RankLaunch &launch : plan_.jobs[i].ranks) {
      launch.environment.emplace_back(contract::kElasticWorker, std::to_string(launch.rank));
    }
  }
  for (const RankPlace &place : plan_.placement.ranks) {
    const Host &host = plan_.hosts[static_cast<size_t>(place.host_index)];
    workers_[place.rank] =
        Worker{host_key(host.user, host.host), host.host, place.local_rank, place.rank, true};
    publish_place(0, place.rank, place, plan_.placement.size());
  }
  next_worker_ = plan_.placement.size();
  rendezvous_->publish(contract::kElasticWorldKey, "0");
}

// Whether every process of the current world still running has said it can join a new world
// in place (perseus_elastic_declare: Horovod's elastic API), and one at least runs.
bool Launcher::survivors_ready() const {
  if (!rendezvous_ || finishing_) return false;
  bool any = false;
  for (const auto &[id, worker] : workers_) {
    if (!worker.alive || worker.rank < 0) continue;
    const bool declared = rendezvous_->lookup(contract::elastic_ready_key(id)).has_value();
    // A process started for a world made in place runs the survivors' script: until it joins,
    // it counts as able to.
    if (!declared && !worker.fresh) return false;
    any = any || declared;
  }
  return any;
}

// A rank failed or a host was lost: when the survivors can, they go on in a new world made of
// them and the free slots of the usable hosts (Horovod's elastic driver); else false, and the
// job ends as without elastic processes (a restart of every rank, Rounds).
bool Launcher::continue_in_place(const std::string &why, const std::string &failed_host,
                                 bool lost) {
  if (!survivors_ready() || !round_.usable_hosts || !round_.record_failure) return false;
  round_.record_failure(failed_host, lost);
  const std::optional<std::vector<HostSpec>> specs = round_.usable_hosts();
  return specs && regroup(why, *specs, true);
}

// A job description for one host as if it ran alone (its GPU binding, exports, the store): new
// processes on it take their launch from here, with the new world's place variables on top.
JobDescription Launcher::host_template(const HostSpec &spec) {
  const std::string key = host_key(spec.user, spec.host);
  LaunchConfig single = config_;
  const Hello &hello = *agents_.at(key).hello;
  const BareSlots bare = [&](const HostSpec &) -> std::optional<int> {
    return hello.gpu_count && *hello.gpu_count > 0 ? std::optional<int>(*hello.gpu_count)
                                                   : std::nullopt;
  };
  const std::vector<Host> merged = merge_hosts({spec}, bare);
  single.np = static_cast<int>(slot_room(merged, config_.npernode));
  single.min_np = 0;
  JobPlan plan = place_job(single, {spec}, bare);
  describe_jobs(
      single, plan, [&](const Host &) -> const Hello & { return hello; }, facts_, exported_);
  return plan.jobs.at(0);
}

// Makes world_ + 1 of the processes still running on the usable hosts `specs` and new ones in
// their free slots (up to --max-np), publishes every member's place, and starts the new ones.
// With `end_world` the current world ends now (its operations fail; its ranks roll back to
// their last commit); without, it goes on until its ranks take in the change at their next
// commit (hosts added: HostsUpdatedInterrupt). False, with nothing changed, when too few ranks
// would be left (--min-np): the job then ends as without elastic processes.
bool Launcher::regroup(const std::string &why, const std::vector<HostSpec> &specs, bool end_world) {
  // Every world made in place is a reset, as each restart is (horovodrun's --reset-limit).
  const int resets = round_.resets_before + static_cast<int>(in_place_.size());
  if (config_.reset_limit >= 0 && resets >= config_.reset_limit) {
    say("perseusrun: --reset-limit " + std::to_string(config_.reset_limit) +
        " reached: no new world is made in place");
    return false;
  }
  const std::vector<Host> hosts = merge_hosts(specs, {});
  std::map<std::string, const HostSpec *> spec_of;
  for (const HostSpec &spec : specs) spec_of.emplace(host_key(spec.user, spec.host), &spec);
  std::map<std::string, size_t> index_of;
  for (size_t h = 0; h < hosts.size(); ++h) index_of[host_key(hosts[h].user, hosts[h].host)] = h;
  std::vector<WorldSurvivor> survivors;
  for (const auto &[id, worker] : workers_) {
    const auto found = index_of.find(worker.host);
    if (!worker.alive || found == index_of.end() || leaving_.count(worker.host)) continue;
    survivors.push_back({id, found->second, worker.slot, worker.rank});
  }
  const WorldPlan next = plan_world(hosts, survivors, config_.npernode,
                                    config_.max_np ? config_.max_np : LLONG_MAX, next_worker_);
  const long long size = next.placement.size();
  const long long fewest = config_.min_np ? config_.min_np : std::max(1, config_.np);
  if (size < fewest) {
    say("perseusrun: " + std::to_string(size) + " ranks' worth of usable hosts, fewer than " +
        "--min-np " + std::to_string(fewest) + ": the job cannot go on in place");
    return false;
  }
  if (!end_world && next.fresh.empty()) return false;
  // Agents for hosts that have none running (new hosts, or one whose agent ended).
  std::vector<HostSpec> to_reach;
  std::set<std::string> reaching;
  for (const NewProcess &fresh : next.fresh) {
    const std::string key = host_key(hosts[fresh.host].user, hosts[fresh.host].host);
    const auto agent = agents_.find(key);
    if ((agent == agents_.end() || agent->second.done) && reaching.insert(key).second) {
      to_reach.push_back(*spec_of.at(key));
    }
  }
  std::vector<ReachedAgent> reached;
  try {
    reached = reach_agents(to_reach, config_, Failures::kThrow);
  } catch (const std::exception &error) {
    say(std::string("perseusrun: error: ") + error.what() + "; the job cannot go on in place");
    return false;
  }
  const HeartbeatTiming timing =
      heartbeat_timing(config_.heartbeat_timeout_seconds, "--heartbeat-timeout");
  std::set<std::string> new_agents;
  for (ReachedAgent &agent : reached) {
    const std::string key = host_key(agent.spec.user, agent.spec.host);
    Agent &slot = agents_[key];
    if (slot.link) slot.link->kill();
    slot.link = std::move(agent.link);
    slot.hello = std::move(agent.hello);
    slot.done = false;
    slot.heartbeat = Heartbeat(timing, monotonic_ms());
    if (std::find(agent_order_.begin(), agent_order_.end(), key) == agent_order_.end()) {
      agent_order_.push_back(key);
    }
    new_agents.insert(key);
  }
  // The old world ends first, so that no rank of it acts on the new one's keys.
  if (end_world) {
    for (int w = std::max(0, world_ - 1); w <= world_; ++w) {
      rendezvous_->publish(contract::elastic_ended_key(w), why);
    }
  }
  // Processes on hosts no longer usable are ended.
  for (auto &[key, agent] : agents_) {
    if (index_of.count(key) || agent.done || leaving_.count(key)) continue;
    agent.link->channel().send(FrameType::kTerminate,
                               encode(Terminate{config_.kill_grace_seconds}));
    leaving_.insert(key);
  }
  for (const NewProcess &fresh : next.fresh) {
    const Host &host = hosts[fresh.host];
    workers_[fresh.id] =
        Worker{host_key(host.user, host.host), host.host, fresh.slot, -1, true, true};
    next_worker_ = std::max(next_worker_, fresh.id + 1);
  }
  output_->grow(next_worker_);
  const Placement &world = next.placement;
  const std::vector<int> &member_ids = next.ids;
  world_ += 1;
  first_exit_published_ = false;
  // Failures gathered until now are answered by this world (it holds whoever still runs).
  new_failures_.clear();
  first_failure_seen_ms_ = 0;
  for (auto &[id, worker] : workers_) worker.rank = -1;
  for (const RankPlace &place : world.ranks) {
    const int id = member_ids[static_cast<size_t>(place.rank)];
    workers_.at(id).rank = place.rank;
    publish_place(world_, id, place, world.size());
  }
  rendezvous_->publish(contract::kElasticWorldKey, std::to_string(world_));
  // After the world: a rank that sees the change (at its commit) finds the world to join.
  if (!end_world) {
    rendezvous_->publish(contract::kElasticHostsKey, std::to_string(++hosts_updates_));
  }
  // The new processes, into their hosts' running agents or in a Job of a new agent.
  for (size_t h = 0; h < hosts.size(); ++h) {
    const std::string key = host_key(hosts[h].user, hosts[h].host);
    std::vector<RankLaunch> launches;
    JobDescription job;
    for (const NewProcess &fresh : next.fresh) {
      if (fresh.host != h) continue;
      if (launches.empty()) job = host_template(*spec_of.at(key));
      const Worker &worker = workers_.at(fresh.id);
      RankLaunch launch =
          job.ranks.at(std::min(static_cast<size_t>(worker.slot), job.ranks.size() - 1));
      launch.rank = fresh.id;
      for (auto &variable : rank_environment(world, worker.rank, facts_)) {
        launch.environment.push_back(std::move(variable));
      }
      launch.environment.emplace_back(contract::kElasticWorker, std::to_string(fresh.id));
      launches.push_back(std::move(launch));
    }
    if (launches.empty()) continue;
    job.ranks = std::move(launches);
    job.elastic = true;
    job.stdin_rank = -1;
    agents_.at(key).link->channel().send(
        new_agents.count(key) ? FrameType::kJob : FrameType::kAddRanks, encode(job));
  }
  in_place_.push_back({monotonic_ms(), why, world_, world.size(), 0});
  say("perseusrun: " + why + "; world " + std::to_string(world_) + " of " +
      std::to_string(world.size()) + " ranks" +
      (next.fresh.empty() ? "" : " (" + std::to_string(next.fresh.size()) + " new)") +
      (end_world ? ", from the ranks' last commit" : ", at the ranks' next commit"));
  return true;
}

// When every member of the latest world has joined it (perseus_elastic_declare with its number).
void Launcher::watch_joins() {
  if (in_place_.empty() || in_place_.back().joined_ms) return;
  const std::string world = std::to_string(world_);
  for (const auto &[id, worker] : workers_) {
    if (worker.rank < 0) continue;
    const auto ready = rendezvous_->lookup(contract::elastic_ready_key(id));
    if (!ready || *ready != world) return;
  }
  in_place_.back().joined_ms = monotonic_ms();
}

// A rank that could not join the current world ends it itself (lib/comm/runtime.cc): the others
// give up their join, and the next world is made of whoever still runs.
void Launcher::watch_broken_joins() {
  if (world_ == 0 || finishing_ || !new_failures_.empty()) return;
  const auto why = rendezvous_->lookup(contract::elastic_ended_key(world_));
  if (!why || !round_.usable_hosts) return;
  const std::optional<std::vector<HostSpec>> specs = round_.usable_hosts();
  if (!specs || !regroup(*why, *specs, true)) {
    note_failure(*why);
    say("perseusrun: error: " + *why + "; ending the job");
    agent_error_ = AgentError{"a rank could not join the world", kExitLaunchFailure};
    end_job(config_.kill_grace_seconds);
  }
}

void Launcher::print_in_place_resets() const {
  if (in_place_.empty()) return;
  std::string summary = "perseusrun: " + std::to_string(in_place_.size()) + " new world" +
                        (in_place_.size() == 1 ? "" : "s") + " made in place:\n";
  for (const InPlaceReset &reset : in_place_) {
    char line[160];
    snprintf(line, sizeof line, "perseusrun:   world %d (%d ranks): ", reset.world, reset.size);
    summary += line + reset.why;
    if (reset.joined_ms) {
      snprintf(line, sizeof line, "; every rank joined it %.2f s later\n",
               static_cast<double>(reset.joined_ms - reset.at_ms) / 1000.0);
      summary += line;
    } else {
      summary += "; not every rank joined it\n";
    }
  }
  fputs(summary.c_str(), stderr);
}

bool Launcher::all_done() const {
  return std::all_of(agents_.begin(), agents_.end(),
                     [](const auto &entry) { return entry.second.done; });
}

Launcher::Agent *Launcher::agent_of_rank_zero() {
  if (plan_.placement.ranks.empty()) return nullptr;
  const Host &host = plan_.hosts[static_cast<size_t>(plan_.placement.ranks[0].host_index)];
  Agent &agent = agents_.at(host_key(host.user, host.host));
  return agent.done ? nullptr : &agent;
}

// A signal that arrived between rounds (they stay blocked, see block_signals).
int pending_signal() {
  sigset_t pending;
  sigemptyset(&pending);
  if (sigpending(&pending) != 0) return 0;
  for (int s : {SIGINT, SIGTERM, SIGHUP}) {
    if (sigismember(&pending, s)) return s;
  }
  return 0;
}

std::string seconds_text(long long ms) {
  char text[32];
  snprintf(text, sizeof text, "%.2f s", static_cast<double>(ms) / 1000.0);
  return text;
}

// The rounds of one job: one round without --max-restarts and --host-discovery-script; with
// them, a new round after each failure (torchrun's --max-restarts) and, in elastic mode, after
// each change of the discovered hosts (horovodrun's elastic mode), until the job succeeds, a
// limit is reached, or something a restart cannot mend ends it.
class Rounds {
 public:
  explicit Rounds(const LaunchConfig &config) : config_(config), start_(monotonic_ms()) {
    if (config.timeout_seconds > 0) {
      round_.deadline_ms = start_ + static_cast<long long>(config.timeout_seconds * 1000);
    }
    elastic_ = !config.host_discovery_script.empty();
    // horovodrun restarts after failures until --reset-limit; torchrun only --max-restarts times.
    failure_cap_ = config.max_restarts >= 0 ? config.max_restarts : (elastic_ ? INT_MAX : 0);
  }
  int run();

 private:
  struct HostRecord {
    int failures = 0;
    int times_blacklisted = 0;
    long long blacklisted_until = 0;  // LLONG_MAX: for good
  };
  struct Reset {
    RoundEnd end;
    long long resumed_at_ms = 0;
  };

  bool usable(const std::string &key, long long now) const;
  void count_failure(const std::string &key, const std::string &name);
  void blacklist(const std::string &key, const std::string &name, const char *why);
  // Elastic mode: the next round's hosts and ranks, waiting up to --elastic-timeout for hosts
  // enough for --min-np ranks. False (with the message said) when they do not come.
  bool choose_hosts();
  std::vector<HostSpec> usable(Discovered found) const;
  long long room(const std::vector<HostSpec> &hosts) const;
  long long cap(bool first) const;
  std::optional<std::string> resize_reason(const Discovered &found,
                                           const std::set<std::string> &keys, size_t ranks);
  void print_resets() const;

  const LaunchConfig &config_;
  const long long start_;
  bool elastic_ = false;
  int failure_cap_ = 0;
  int failure_restarts_ = 0;
  int worlds_in_place_ = 0;    // new worlds made in place, over every round
  int last_failure_code_ = 0;  // the exit code of the last failure that asked for a restart
  int signal_ = 0;             // a signal that came while waiting for hosts
  Round round_;
  std::map<std::string, HostRecord> hosts_;
  std::vector<Reset> resets_;
  std::string last_discovery_problem_;
};

bool Rounds::usable(const std::string &key, long long now) const {
  const auto found = hosts_.find(key);
  return found == hosts_.end() || found->second.blacklisted_until <= now;
}

// A host that failed twice (a rank on it failed first, or its agent was lost) is blacklisted:
// for good, or for --blacklist-cooldown-range's MIN seconds, doubled each time, at most MAX.
void Rounds::count_failure(const std::string &key, const std::string &name) {
  if (!elastic_ || key.empty()) return;
  if (++hosts_[key].failures >= 2) blacklist(key, name, "failed twice");
}

void Rounds::blacklist(const std::string &key, const std::string &name, const char *why) {
  HostRecord &record = hosts_[key];
  record.failures = 0;
  record.times_blacklisted += 1;
  if (config_.blacklist_cooldown_max <= 0) {
    record.blacklisted_until = LLONG_MAX;
    fprintf(stderr, "perseusrun: host %s %s: blacklisted for the rest of the job\n", name.c_str(),
            why);
    return;
  }
  long long seconds = config_.blacklist_cooldown_min;
  for (int i = 1; i < record.times_blacklisted && seconds < config_.blacklist_cooldown_max; ++i) {
    seconds *= 2;
  }
  seconds = std::min<long long>(std::max<long long>(seconds, 1), config_.blacklist_cooldown_max);
  record.blacklisted_until = monotonic_ms() + seconds * 1000;
  fprintf(stderr, "perseusrun: host %s %s: blacklisted for %lld s\n", name.c_str(), why, seconds);
}

// The hosts the script found that are not blacklisted.
std::vector<HostSpec> Rounds::usable(Discovered found) const {
  std::vector<HostSpec> hosts = std::move(found.hosts);
  const long long now = monotonic_ms();
  hosts.erase(std::remove_if(hosts.begin(), hosts.end(),
                             [&](const HostSpec &spec) {
                               return !usable(host_key(spec.user, spec.host), now);
                             }),
              hosts.end());
  return hosts;
}

// The discovered hosts' room, merged as the placement will merge them (every line of the
// script's output has its slots, so no host waits for its Hello).
long long Rounds::room(const std::vector<HostSpec> &hosts) const {
  return slot_room(merge_hosts(hosts, {}), config_.npernode);
}

// The most ranks a round may run: -np in the first round (horovodrun's starting size), else
// --max-np; no limit without them.
long long Rounds::cap(bool first) const {
  if (first && config_.np) return config_.np;
  return config_.max_np ? config_.max_np : LLONG_MAX;
}

bool Rounds::choose_hosts() {
  // horovodrun's: --min-np defaults to -np.
  const long long fewest = config_.min_np ? config_.min_np : std::max(1, config_.np);
  const long long give_up =
      monotonic_ms() + static_cast<long long>(config_.elastic_timeout_seconds * 1000);
  for (;;) {
    const Discovered found = run_discovery(config_.host_discovery_script);
    const std::string &problem = found.problem;
    std::vector<HostSpec> hosts = usable(found);
    const long long ranks = std::min(room(hosts), cap(round_.restart == 0));
    if (problem.empty() && ranks >= fewest) {
      round_.mentions = std::move(hosts);
      round_.np = static_cast<int>(ranks);
      return true;
    }
    if (!problem.empty() && problem != last_discovery_problem_) {
      fprintf(stderr, "perseusrun: warning: %s; trying again\n", problem.c_str());
    }
    last_discovery_problem_ = problem;
    if ((signal_ = pending_signal())) {
      fprintf(stderr, "perseusrun: got %s while waiting for hosts; ending the job\n",
              signal_name(signal_).c_str());
      return false;
    }
    if (monotonic_ms() >= give_up) {
      fprintf(stderr,
              "perseusrun: error: %lld ranks' worth of usable hosts after --elastic-timeout %g "
              "s, fewer than --min-np %lld%s; ending the job\n",
              std::max(0LL, ranks), config_.elastic_timeout_seconds, fewest,
              problem.empty() ? "" : (" (" + problem + ")").c_str());
      return false;
    }
    usleep(kDiscoveryWaitMs * 1000);
  }
}

std::optional<std::string> Rounds::resize_reason(const Discovered &found,
                                                 const std::set<std::string> &keys, size_t ranks) {
  const std::string &problem = found.problem;
  const std::vector<HostSpec> hosts = usable(found);
  if (!problem.empty()) {
    if (problem != last_discovery_problem_) {
      fprintf(stderr, "perseusrun: warning: %s; the job goes on with its hosts\n", problem.c_str());
    }
    last_discovery_problem_ = problem;
    return std::nullopt;
  }
  last_discovery_problem_.clear();
  std::set<std::string> listed;
  std::string added;
  for (const HostSpec &spec : hosts) {
    const std::string key = host_key(spec.user, spec.host);
    if (listed.insert(key).second && !keys.count(key))
      added += (added.empty() ? "" : ", ") + spec.host;
  }
  std::string removed;
  for (const std::string &key : keys) {
    if (!listed.count(key)) removed += (removed.empty() ? "" : ", ") + key;
  }
  if (!removed.empty()) return "hosts gone from --host-discovery-script's output: " + removed;
  const long long slots = room(hosts);
  const long long now = static_cast<long long>(ranks);
  if (slots > now && now < cap(false)) {
    if (!added.empty()) return "hosts added by --host-discovery-script: " + added;
    return "--host-discovery-script lists " + std::to_string(slots) + " slots, the job runs " +
           std::to_string(now) + " ranks";
  }
  return std::nullopt;
}

int Rounds::run() {
  int exit_code = kExitSuccess;
  // From here on SIGINT, SIGTERM and SIGHUP wait to be read: by each round's Launcher, and in
  // between (waiting for hosts, before a restart) by pending_signal().
  block_signals();
  if (elastic_) {
    round_.discovery_script = config_.host_discovery_script;
    round_.resize_check = [this](const Discovered &found, const std::set<std::string> &keys,
                                 size_t ranks) { return resize_reason(found, keys, ranks); };
    round_.usable_hosts = [this]() -> std::optional<std::vector<HostSpec>> {
      const Discovered found = run_discovery(config_.host_discovery_script);
      if (!found.problem.empty()) return std::nullopt;
      return usable(found);
    };
    round_.record_failure = [this](const std::string &key, bool lost) {
      if (lost) {
        blacklist(key, key, "was lost");
      } else {
        count_failure(key, key);
      }
    };
  }
  for (;;) {
    if (elastic_ && !choose_hosts()) {
      exit_code = signal_              ? 128 + signal_
                  : last_failure_code_ ? last_failure_code_
                                       : kExitLaunchFailure;
      break;
    }
    RoundEnd end;
    try {
      end = Launcher(config_, round_).run();
    } catch (const std::exception &error) {
      if (round_.restart == 0) throw;  // nothing has run: the usual launch error
      // A restart that cannot start (too few hosts left, a host unreachable now): the job ends
      // with the failure that asked for the restart.
      fprintf(stderr,
              "perseusrun: error: restart %d could not start: %s; the job ends with exit code "
              "%d\n",
              round_.restart, error.what(), exit_code);
      break;
    }
    if (!resets_.empty() && !resets_.back().resumed_at_ms) {
      resets_.back().resumed_at_ms = end.started_at_ms;
    }
    exit_code = end.exit_code;
    worlds_in_place_ += end.worlds_in_place;
    if (!end.resized && end.exit_code != kExitSuccess) last_failure_code_ = end.exit_code;
    if (!end.restartable || pending_signal()) break;
    if (!end.resized) {
      if (failure_restarts_ >= failure_cap_) break;
      failure_restarts_ += 1;
    }
    if (config_.reset_limit >= 0 &&
        static_cast<int>(resets_.size()) + worlds_in_place_ >= config_.reset_limit) {
      fprintf(stderr, "perseusrun: --reset-limit %d reached; the job ends\n", config_.reset_limit);
      break;
    }
    round_.restart += 1;
    round_.resets_before = static_cast<int>(resets_.size()) + 1 + worlds_in_place_;
    // A lost host is left out: in elastic mode blacklisted (it may come back after the
    // cool-down), else for the rest of the job. A host whose rank failed first is blacklisted
    // in elastic mode at its second failure.
    for (const std::string &key : end.lost_hosts) {
      if (elastic_) {
        blacklist(key, key, "was lost");
      } else {
        round_.lost_hosts.insert(key);
      }
    }
    if (end.lost_hosts.empty()) count_failure(end.failed_host, end.failed_host);
    fprintf(stderr, "perseusrun: restarting every rank (restart %d%s) after: %s%s\n",
            round_.restart,
            // " of N" outside elastic mode only, where every restart is a failure's.
            elastic_ ? "" : (" of " + std::to_string(failure_cap_)).c_str(), end.why.c_str(),
            end.lost_names.empty() ? "" : ("; leaving out " + end.lost_names).c_str());
    resets_.push_back({std::move(end), 0});
  }
  print_resets();
  return exit_code;
}

void Rounds::print_resets() const {
  if (resets_.empty()) return;
  std::string summary = "perseusrun: " + std::to_string(resets_.size()) + " restart" +
                        (resets_.size() == 1 ? "" : "s") + ":\n";
  for (size_t i = 0; i < resets_.size(); ++i) {
    const Reset &reset = resets_[i];
    summary += "perseusrun:   " + std::to_string(i + 1) + ". at " +
               seconds_text(reset.end.failed_at_ms - start_) + ": " + reset.end.why;
    if (!reset.end.lost_names.empty()) summary += "; lost: " + reset.end.lost_names;
    summary += reset.resumed_at_ms
                   ? "; stopped " + seconds_text(reset.resumed_at_ms - reset.end.failed_at_ms) +
                         " (until every rank of the next round had started)"
                   : "; the next round did not start every rank";
    summary += "\n";
  }
  fputs(summary.c_str(), stderr);
}

}  // namespace

int run_launcher(const LaunchConfig &config) { return Rounds(config).run(); }

}  // namespace perseus::launch

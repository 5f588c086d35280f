#include "lib/launch/agent/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>

#include "lib/launch/agent/gpu_probe.h"
#include "lib/launch/agent/host_check.h"
#include "lib/launch/agent/job_cgroup.h"
#include "lib/launch/agent/job_guard.h"
#include "lib/launch/agent/process_tree.h"
#include "lib/launch/agent/rank_process.h"
#include "lib/launch/agent/secret_file.h"
#include "lib/launch/errors.h"
#include "lib/launch/local_host.h"
#include "lib/launch/protocol/agent_protocol.h"
#include "lib/launch/protocol/frame_channel.h"
#include "lib/launch/protocol/heartbeat.h"
#include "lib/rendezvous/job_contract.h"
#include "perseus/config.h"

extern char **environ;

namespace perseus::launch {

namespace {

// While this much is queued for the launcher, rank output is not read: ranks block on their
// pipes instead of the agent's memory growing.
constexpr size_t kOutputHighWater = 4u << 20;
constexpr size_t kOutputChunk = 64 * 1024;
// A launcher that went away gets at most this grace before SIGKILL.
constexpr double kLostLauncherGrace = 2.0;
constexpr long long kRescanMs = 50;

struct Rank {
  int rank = 0;
  RankProcess process;
  bool reaped = false;
  std::string stdin_buffer;
  bool stdin_eof = false;
};

std::vector<std::string> merged_environment(const EnvironmentChanges &changes) {
  std::map<std::string, std::string> variables;
  for (char **entry = environ; *entry; ++entry) {
    const std::string text(*entry);
    const size_t equals = text.find('=');
    if (equals != std::string::npos) variables[text.substr(0, equals)] = text.substr(equals + 1);
  }
  for (const auto &[name, value] : changes) variables[name] = value;
  std::vector<std::string> result;
  for (const auto &[name, value] : variables) result.push_back(name + "=" + value);
  return result;
}

std::string variable(const std::vector<std::string> &environment, const std::string &name) {
  for (const auto &entry : environment) {
    if (entry.compare(0, name.size() + 1, name + "=") == 0) return entry.substr(name.size() + 1);
  }
  return "";
}

void check_no_nul(const std::vector<std::string> &strings, const std::string &what) {
  for (const auto &s : strings) {
    if (s.find('\0') != std::string::npos) {
      throw InputError(what + " contains a NUL byte, which no program can receive: '" +
                       s.substr(0, s.find('\0')) + "\\0...'");
    }
  }
}

UniqueFd make_signal_fd() {
  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&signals, s);
  sigprocmask(SIG_BLOCK, &signals, nullptr);
  UniqueFd fd(signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!fd.valid()) throw_system_error("signalfd", "");
  return fd;
}

class Agent {
 public:
  Agent()
      : channel_(UniqueFd(fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3)),
                 UniqueFd(fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3)), "launcher"),
        signals_(make_signal_fd()) {}

  int run();

 private:
  bool receive_job();
  void write_secret();
  void start_guard();
  void check_in_cgroup(const Rank &rank);
  pid_t guard_pid() const { return guard_ ? guard_->pid() : 0; }
  void start_ranks();
  void start_rank_of(const RankLaunch &launch);
  void add_ranks(const std::string &payload);
  void loop();
  void poll_once();
  void read_frames();
  void handle_frames(const std::vector<Frame> &frames);
  void handle_signals();
  void reap_children();
  void read_output(Rank &rank, OutputStream stream, UniqueFd &pipe);
  void drain_output(Rank &rank);
  void write_stdin(Rank &rank);
  void terminate(double grace_seconds);
  void tick();
  void start_heartbeat();
  void watch_launcher();
  bool finished();
  bool output_wanted() const;
  void fail(const std::string &message, int exit_code);
  Rank *find_rank(pid_t pid);
  Rank *stdin_rank();

  FrameChannel channel_;
  UniqueFd signals_;
  JobDescription job_;
  std::vector<Frame> early_frames_;
  std::unique_ptr<SecretFile> secret_;
  std::unique_ptr<JobGuard> guard_;  // destroyed first: it removes the secret file too
  std::vector<Rank> ranks_;
  Heartbeat heartbeat_;  // the launcher's, once the job runs
  bool launcher_gone_ = false;
  bool terminating_ = false;
  bool output_paused_ = false;  // the launcher cannot write output now (kPauseOutput)
  long long kill_at_ms_ = 0;
  long long next_scan_ms_ = 0;   // next SIGKILL sweep while terminating
  long long next_check_ms_ = 0;  // next look for leftovers once every rank has ended
};

int Agent::run() {
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  ::signal(SIGPIPE, SIG_IGN);
  Hello hello;
  hello.version = PERSEUS_VERSION;
  hello.hostname = local_hostname();
  hello.cpu_count = usable_cpu_count();
  hello.gpu_count = probe_gpu_count();
  hello.free_port = free_tcp_port();
  if (const char *visible = getenv("CUDA_VISIBLE_DEVICES")) hello.cuda_visible_devices = visible;
  channel_.send(FrameType::kHello, encode(hello));
  if (!receive_job()) return kExitLaunchFailure;
  try {
    start_heartbeat();
    write_secret();
    start_guard();
    start_ranks();
  } catch (const InputError &error) {
    fail(error.what(), kExitUsage);
  } catch (const LaunchError &error) {
    fail(error.what(), error.exit_code());
  }
  handle_frames(early_frames_);
  loop();
  guard_.reset();  // every process has ended: the guard removes the cgroup and the files
  if (!launcher_gone_) {
    channel_.send(FrameType::kDone, "");
    // For as long as the launcher lives: it reads until Done (a peer gone ends the wait).
    channel_.flush_until(std::numeric_limits<long long>::max());
  }
  return kExitSuccess;
}

// Answers Check requests until the Job comes. False when the launcher goes away first.
bool Agent::receive_job() {
  for (;;) {
    std::vector<Frame> frames;
    while (frames.empty()) {
      pollfd fds[2] = {
          {channel_.read_fd(), POLLIN, 0},
          {channel_.write_fd(), static_cast<short>(channel_.wants_write() ? POLLOUT : 0), 0}};
      poll(fds, 2, -1);
      if (!channel_.flush() || !channel_.read_available(frames)) return false;
    }
    for (auto frame = frames.begin(); frame != frames.end(); ++frame) {
      if (frame->type == FrameType::kCheck) {
        const CheckRequest request = decode_check_request(frame->payload, channel_.peer());
        channel_.send(FrameType::kCheckReport, encode(run_host_check(request)));
      } else if (frame->type == FrameType::kJob) {
        job_ = decode_job(frame->payload, channel_.peer());
        // Stdin for rank 0, even its end, may have come in the same read: keep it for later.
        early_frames_.assign(frame + 1, frames.end());
        return true;
      } else {
        return false;
      }
    }
  }
}

// The rendezvous secret, in a 0600 file inside a 0700 folder of the job's own, for this host's
// ranks; removed when the agent ends.
void Agent::write_secret() {
  if (!job_.secret.empty()) secret_ = std::make_unique<SecretFile>(job_.job_id, job_.secret);
}

// The guard ends what is left of the job on this host if the agent dies (job_guard.h). Started
// before the first rank, so that no rank runs unguarded.
void Agent::start_guard() {
  GuardPlan plan;
  const CgroupChoice choice = job_cgroup_choice();
  if (choice != CgroupChoice::kOff) {
    plan.cgroup_name = "perseus-" + job_.job_id + "-" + std::to_string(getpid());
  }
  if (secret_) {
    plan.files.push_back(secret_->path());
    plan.folders.push_back(secret_->folder());
  }
  guard_ = std::make_unique<JobGuard>(plan);
  if (choice == CgroupChoice::kRequired && !guard_->cgroup()) {
    throw LaunchError("PERSEUS_AGENT_CGROUP=1 on " + local_hostname() +
                          " but no job cgroup could be made: " + guard_->cgroup_problem() +
                          "; unset it to run without one where none can be made",
                      kExitLaunchFailure);
  }
}

// A rank that could not join the cgroup is not ended by the guard: say so. A rank that has
// already ended (a zombie, or reaped) has left the cgroup as every process does when it exits;
// it had joined it before its exec, so its children are in it: no warning for it.
void Agent::check_in_cgroup(const Rank &rank) {
  if (!guard_->cgroup() || in_cgroup(rank.process.pid, *guard_->cgroup())) return;
  if (!start_time_of(rank.process.pid)) return;
  fprintf(stderr,
          "perseusrun agent on %s: warning: rank %d (pid %d) is not in the job's cgroup %s: if "
          "the agent is killed, processes that rank starts may be left running\n",
          local_hostname().c_str(), rank.rank, static_cast<int>(rank.process.pid),
          guard_->cgroup()->c_str());
}

void Agent::start_ranks() {
  check_no_nul(job_.argv, "an argument of the program");
  if (job_.argv.empty()) throw InputError("no program to run");
  check_working_directory(job_.working_directory, job_.host_label);
  ensure_fd_room(job_.ranks.size(), job_.host_label);
  for (const auto &launch : job_.ranks) start_rank_of(launch);
}

void Agent::start_rank_of(const RankLaunch &launch) {
  {
    RankCommand command;
    EnvironmentChanges environment = rank_changes(job_, launch);
    if (secret_) environment.emplace_back(contract::kSecretFile, secret_->path());
    command.environment = merged_environment(environment);
    check_no_nul(command.environment, "the environment of rank " + std::to_string(launch.rank));
    command.argv = job_.argv;
    command.working_directory = job_.working_directory;
    command.gets_stdin = launch.rank == job_.stdin_rank;
    command.cgroup_procs_fd = guard_->cgroup_procs_fd();
    command.program = resolve_program(job_.argv[0], variable(command.environment, "PATH"),
                                      job_.working_directory, job_.host_label);
    Rank rank;
    rank.rank = launch.rank;
    rank.process = start_rank(command);
    check_in_cgroup(rank);
    set_nonblocking(rank.process.stdout_pipe.get());
    set_nonblocking(rank.process.stderr_pipe.get());
    if (rank.process.stdin_pipe.valid()) set_nonblocking(rank.process.stdin_pipe.get());
    channel_.send(FrameType::kStarted, encode(RankStarted{rank.rank, rank.process.pid}));
    ranks_.push_back(std::move(rank));
  }
}

// An elastic job's new ranks (kAddRanks), started as the Job's were; none once ending.
void Agent::add_ranks(const std::string &payload) {
  if (!job_.elastic || terminating_) return;
  const JobDescription more = decode_job(payload, channel_.peer());
  try {
    ensure_fd_room(ranks_.size() + more.ranks.size(), job_.host_label);
    for (const auto &launch : more.ranks) start_rank_of(launch);
  } catch (const InputError &error) {
    fail(error.what(), kExitUsage);
  } catch (const LaunchError &error) {
    fail(error.what(), error.exit_code());
  }
}

void Agent::fail(const std::string &message, int exit_code) {
  channel_.send(FrameType::kError, encode(AgentError{message, exit_code}));
  terminate(job_.kill_grace_seconds);
}

void Agent::loop() {
  while (!finished()) {
    poll_once();
    tick();
    watch_launcher();
  }
}

void Agent::poll_once() {
  std::vector<pollfd> fds;
  fds.push_back({signals_.get(), POLLIN, 0});
  fds.push_back({launcher_gone_ ? -1 : channel_.read_fd(), POLLIN, 0});
  fds.push_back({channel_.wants_write() && !launcher_gone_ ? channel_.write_fd() : -1, POLLOUT, 0});
  const bool room = output_wanted();
  for (auto &rank : ranks_) {
    fds.push_back({room ? rank.process.stdout_pipe.get() : -1, POLLIN, 0});
    fds.push_back({room ? rank.process.stderr_pipe.get() : -1, POLLIN, 0});
    const bool pending_input = !rank.stdin_buffer.empty() || rank.stdin_eof;
    fds.push_back({pending_input ? rank.process.stdin_pipe.get() : -1, POLLOUT, 0});
  }
  long long timeout = terminating_ || ranks_.empty() ? kRescanMs : 1000;
  if (!launcher_gone_) timeout = std::min(timeout, heartbeat_.wait_ms(monotonic_ms()));
  if (poll(fds.data(), fds.size(), static_cast<int>(timeout)) < 0 && errno != EINTR)
    throw_system_error("poll", "");
  if (fds[0].revents) handle_signals();
  if (fds[1].revents) read_frames();
  if (fds[2].revents && !channel_.flush()) launcher_gone_ = true;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank &rank = ranks_[i];
    if (fds[3 + 3 * i].revents) read_output(rank, OutputStream::kStdout, rank.process.stdout_pipe);
    if (fds[4 + 3 * i].revents) read_output(rank, OutputStream::kStderr, rank.process.stderr_pipe);
    if (fds[5 + 3 * i].revents) write_stdin(rank);
  }
  if (!launcher_gone_ && !channel_.flush()) launcher_gone_ = true;
  if (launcher_gone_) terminate(std::min(job_.kill_grace_seconds, kLostLauncherGrace));
}

void Agent::read_frames() {
  std::vector<Frame> frames;
  if (!channel_.read_available(frames)) launcher_gone_ = true;
  if (!frames.empty()) heartbeat_.heard(monotonic_ms());
  handle_frames(frames);
}

void Agent::handle_frames(const std::vector<Frame> &frames) {
  for (const Frame &frame : frames) {
    if (frame.type == FrameType::kTerminate) {
      terminate(decode_terminate(frame.payload, channel_.peer()).grace_seconds);
    } else if (frame.type == FrameType::kAddRanks) {
      add_ranks(frame.payload);
    } else if (frame.type == FrameType::kPauseOutput || frame.type == FrameType::kResumeOutput) {
      output_paused_ = frame.type == FrameType::kPauseOutput;
    } else if (Rank *rank = stdin_rank(); rank && frame.type == FrameType::kStdin) {
      rank->stdin_buffer += frame.payload;
    } else if (rank && frame.type == FrameType::kStdinEof) {
      rank->stdin_eof = true;
    }
  }
}

void Agent::handle_signals() {
  signalfd_siginfo info{};
  while (::read(signals_.get(), &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    if (info.ssi_signo == SIGCHLD) continue;
    terminate(job_.kill_grace_seconds);
  }
  reap_children();
}

void Agent::reap_children() {
  int status = 0;
  pid_t pid = 0;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    Rank *rank = find_rank(pid);
    if (!rank) continue;  // an orphan re-parented to us
    rank->reaped = true;
    drain_output(*rank);
    RankExited exited{rank->rank, pid, 0, 0};
    if (WIFSIGNALED(status)) exited.signal = WTERMSIG(status);
    if (WIFEXITED(status)) exited.exit_code = WEXITSTATUS(status);
    channel_.send(FrameType::kExited, encode(exited));
    rank->process.stdin_pipe.reset();
    rank->stdin_buffer.clear();
  }
}

void Agent::read_output(Rank &rank, OutputStream stream, UniqueFd &pipe) {
  std::string chunk(kOutputChunk, '\0');
  const ssize_t n = retry_on_eintr([&] { return ::read(pipe.get(), chunk.data(), chunk.size()); });
  if (n > 0) {
    chunk.resize(static_cast<size_t>(n));
    channel_.send(FrameType::kOutput, encode(OutputChunk{rank.rank, stream, std::move(chunk)}));
  } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
    pipe.reset();
  }
}

// Reads what a rank wrote before it exited, so that its Exited message comes after it.
void Agent::drain_output(Rank &rank) {
  for (auto [stream, pipe] : {std::pair{OutputStream::kStdout, &rank.process.stdout_pipe},
                              std::pair{OutputStream::kStderr, &rank.process.stderr_pipe}}) {
    for (int budget = 256; budget > 0 && pipe->valid(); --budget) {
      const size_t before = channel_.queued_bytes();
      read_output(rank, stream, *pipe);
      if (channel_.queued_bytes() == before) break;
    }
  }
}

void Agent::write_stdin(Rank &rank) {
  if (!rank.stdin_buffer.empty()) {
    const ssize_t n = retry_on_eintr([&] {
      return ::write(rank.process.stdin_pipe.get(), rank.stdin_buffer.data(),
                     rank.stdin_buffer.size());
    });
    const size_t written = n > 0 ? static_cast<size_t>(n) : rank.stdin_buffer.size();
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0) rank.process.stdin_pipe.reset();  // the rank closed its stdin: drop the rest
    rank.stdin_buffer.erase(0, written);
    channel_.send(FrameType::kStdinAck, encode_count(written));
  }
  if (rank.stdin_buffer.empty() && rank.stdin_eof) rank.process.stdin_pipe.reset();
}

void Agent::terminate(double grace_seconds) {
  const long long deadline = monotonic_ms() + static_cast<long long>(grace_seconds * 1000);
  if (terminating_) {
    kill_at_ms_ = std::min(kill_at_ms_, deadline);
    return;
  }
  terminating_ = true;
  kill_at_ms_ = deadline;
  signal_descendants(getpid(), SIGTERM, guard_pid());
}

void Agent::tick() {
  const long long now = monotonic_ms();
  if (terminating_ && now >= kill_at_ms_ && now >= next_scan_ms_) {
    signal_descendants(getpid(), SIGKILL, guard_pid());
    next_scan_ms_ = now + kRescanMs;
  }
  reap_children();
}

void Agent::start_heartbeat() {
  heartbeat_ =
      Heartbeat(heartbeat_timing(job_.heartbeat_timeout_seconds, "the job's heartbeat timeout"),
                monotonic_ms());
}

// Sends the agent's heartbeat, and ends the ranks when the launcher has been silent for the
// heartbeat timeout: it died without its connection closing, its host or the network to it went
// down, or it is stopped. No rank may outlive a lost launcher.
void Agent::watch_launcher() {
  if (launcher_gone_) return;
  const long long now = monotonic_ms();
  if (heartbeat_.send_due(now)) channel_.send(FrameType::kHeartbeat, "");
  if (!heartbeat_.lost(now)) return;
  fprintf(stderr,
          "perseusrun agent on %s: error: no message from the launcher for %lld s "
          "(--heartbeat-timeout); ending this host's ranks\n",
          job_.host_label.c_str(), heartbeat_.silence_ms(now) / 1000);
  launcher_gone_ = true;
  terminate(std::min(job_.kill_grace_seconds, kLostLauncherGrace));
}

bool Agent::finished() {
  const bool all_reaped =
      std::all_of(ranks_.begin(), ranks_.end(), [](const Rank &r) { return r.reaped; });
  if (!all_reaped) return false;
  // An elastic job's agent waits for more ranks until told to end (or the launcher is gone).
  if (job_.elastic && !terminating_ && !launcher_gone_) return false;
  const long long now = monotonic_ms();
  if (now < next_check_ms_) return false;
  next_check_ms_ = now + kRescanMs;
  if (!descendants_of(getpid(), guard_pid()).empty()) {
    terminate(job_.kill_grace_seconds);  // leftovers of ranks that ended
    return false;
  }
  return std::none_of(ranks_.begin(), ranks_.end(), [](const Rank &r) {
    return r.process.stdout_pipe.valid() || r.process.stderr_pipe.valid();
  });
}

// Whether to read the ranks' pipes now: not while 4 MiB wait for the launcher, nor while the
// launcher's own output is stuck, unless the job is ending (the pipes must reach their end).
bool Agent::output_wanted() const {
  if (launcher_gone_) return true;
  if (output_paused_ && !terminating_) return false;
  return channel_.queued_bytes() < kOutputHighWater;
}

Rank *Agent::find_rank(pid_t pid) {
  for (auto &rank : ranks_) {
    if (rank.process.pid == pid && !rank.reaped) return &rank;
  }
  return nullptr;
}

Rank *Agent::stdin_rank() {
  for (auto &rank : ranks_) {
    if (rank.rank == job_.stdin_rank && !rank.reaped) return &rank;
  }
  return nullptr;
}

}  // namespace

// Variables that describe the agent's own task when a workload manager started it (the one
// task of an srun step, a batch script's task) and would misdescribe a rank as that task: its
// rank and the step's size and process-manager sockets. The job's allocation (SLURM_JOB_*,
// SLURM_NODEID, SLURM_CLUSTER_NAME, ...) stays, as it holds for the ranks too.
void drop_task_variables() {
  static constexpr const char *kTaskVariables[] = {
      "SLURM_PROCID",
      "SLURM_LOCALID",
      "SLURM_NTASKS",
      "SLURM_NPROCS",
      "SLURM_STEP_ID",
      "SLURM_STEPID",
      "SLURM_STEP_NUM_TASKS",
      "SLURM_STEP_NUM_NODES",
      "SLURM_STEP_NODELIST",
      "SLURM_STEP_TASKS_PER_NODE",
      "SLURM_TASK_PID",
      "SLURM_GTIDS",
      "SLURM_LAUNCH_NODE_IPADDR",
      "SLURM_SRUN_COMM_HOST",
      "SLURM_SRUN_COMM_PORT",
      "SLURM_STEP_LAUNCHER_PORT",
      "SLURM_CPU_BIND",
      "SLURM_CPU_BIND_LIST",
      "SLURM_CPU_BIND_TYPE",
      "SLURM_CPU_BIND_VERBOSE",
      "SLURM_DISTRIBUTION",
      "SLURM_UMASK",
      "PMI_FD",
      "PMI_RANK",
      "PMI_SIZE",
      "PMI_JOBID",
      "PMI_SPAWNED",
      "PMIX_RANK",
      "PMIX_NAMESPACE",
      "PMIX_SERVER_URI2",
      "PMIX_SERVER_URI3",
      "PMIX_SERVER_URI4",
      "PMIX_SERVER_URI21",
      "PMIX_SERVER_URI41",
      "PMIX_SECURITY_MODE",
  };
  for (const char *name : kTaskVariables) unsetenv(name);
}

int run_agent() {
  drop_task_variables();
  try {
    return Agent().run();
  } catch (const std::exception &error) {
    // The launcher reports this as the agent's end; stderr reaches the user either way. No
    // process of the job may outlive the agent.
    fprintf(stderr, "perseusrun agent on %s: error: %s\n", local_hostname().c_str(), error.what());
    while (signal_descendants(getpid(), SIGKILL) > 0) {
      while (waitpid(-1, nullptr, WNOHANG) > 0) {
      }
      usleep(10000);
    }
    return kExitLaunchFailure;
  }
}

}  // namespace perseus::launch

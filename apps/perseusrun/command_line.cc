#include "apps/perseusrun/command_line.h"

#include <libssh2.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <sstream>
#include <tuple>

#include "lib/launch/errors.h"
#include "lib/launch/planning/host_syntax.h"
#include "lib/launch/protocol/heartbeat.h"
#include "perseus/config.h"

namespace perseus::app {

namespace {

using launch::InputError;

constexpr const char *kDescription =
    "Start a distributed training job. Single-dash long options work as in mpirun: -np 4,\n"
    "-hostfile FILE, -npernode 8.";

class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App *, std::string) const override {
    return "Usage: perseusrun [options] [--] program [args...]\n";
  }
};

constexpr const char *kExamples = R"(Examples:
  perseusrun -np 8 -H localhost:8 python train.py
  perseusrun -np 32 -npernode 8 -hostfile mpi_host.txt ./train.sh
  perseusrun -allow-run-as-root -bind-to none -np 8 -npernode 8 -x NCCL_DEBUG=INFO -x PATH \
             -hostfile mpi_host.txt ./train.sh
  perseusrun -np 4 --output-filename logs -- python -u train.py --epochs 3
  perseusrun -np 16 -H a:8,b:8 --max-restarts 3 python train.py      # restart on failure
  perseusrun -np 8 --min-np 4 --max-np 16 --host-discovery-script ./hosts.sh python train.py

Each rank gets the variables of mpirun, torchrun and horovodrun (RANK, LOCAL_RANK,
OMPI_COMM_WORLD_RANK, HOROVOD_RANK, MASTER_ADDR, ...), and its output lines are tagged
"[1,<rank>]<stdout>:". Exit codes: 0 success, 1 launch failure, 2 usage error, 124 --timeout,
126/127 program not executable/not found, else the failing rank's code or 128+signal.
See docs/USAGE.md for everything.)";

// The values given on the command line, as written; converted and checked in `to_config`.
struct RawOptions {
  std::string max_restarts, min_np, max_np, host_discovery_script, elastic_timeout, reset_limit;
  std::vector<std::pair<std::string, std::string>> blacklist_cooldown;  // MIN MAX
  std::string np, npernode, map_by = "slot", gpu_bind = "list", kill_grace = "5", timeout,
                            master_port, bind_to = "none";
  std::vector<std::string> hosts, exports;
  std::vector<std::pair<std::string, std::string>> mca;
  std::string hostfile, output_directory, working_directory;
  std::string rsh, launch_agent = "auto", ssh_identity, ssh_user, ssh_port, ssh_timeout = "10",
                   remote_program, address, interface;
  bool ssh_accept_new = false, check = false, json = false, no_preflight = false;
  std::string gpu_busy_threshold;
  std::string heartbeat_timeout = "10";
  bool oversubscribe = false, display_map = false, verbose = false, help = false, version = false,
       ignored = false;
};

void add_options(CLI::App &app, RawOptions &raw) {
  app.add_option("-n,--np,-c", raw.np, "Number of ranks (default: all slots)");
  app.add_option("-H,--host", raw.hosts, "Hosts: host[:slots],... (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--hostfile,--machinefile", raw.hostfile, "Open MPI hostfile");
  app.add_option("-N,--npernode", raw.npernode, "Ranks per host (overrides slots)");
  app.add_option("--map-by", raw.map_by, "slot (fill each host in turn) or node (round robin)");
  app.add_flag("--oversubscribe", raw.oversubscribe, "Allow more ranks than slots");
  app.add_option("--gpu-bind", raw.gpu_bind, "list (default), isolate or none");
  app.add_option("-x", raw.exports, "Pass VAR, or set VAR=value, for every rank (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--mca", raw.mca, "Open MPI parameter NAME VALUE: ranks get OMPI_MCA_NAME")
      ->allow_extra_args(false);
  app.add_option("--output-filename", raw.output_directory,
                 "Also write each rank's output to DIR/1/rank.N/{stdout,stderr}");
  app.add_option("--kill-grace", raw.kill_grace, "Seconds from SIGTERM to SIGKILL (default 5)");
  app.add_option("--timeout", raw.timeout, "End the whole job after SECONDS (exit code 124)");
  app.add_option("--max-restarts,--max_restarts", raw.max_restarts,
                 "Restart every rank up to N times when a rank fails or a host is lost "
                 "(torchrun's; default 0)");
  app.add_option("--min-np,--min-num-proc", raw.min_np,
                 "The fewest ranks a restart may run with (--max-restarts, elastic mode)");
  app.add_option("--max-np,--max-num-proc", raw.max_np,
                 "Elastic mode: the most ranks (default: as many as the hosts hold)");
  app.add_option("--host-discovery-script", raw.host_discovery_script,
                 "Elastic mode (horovodrun's): a program printing host:slots lines, run every "
                 "second; the job restarts on the new set of hosts when they change");
  app.add_option("--elastic-timeout", raw.elastic_timeout,
                 "Elastic mode: seconds to wait for hosts enough for --min-np (default 600)");
  app.add_option("--reset-limit", raw.reset_limit,
                 "Elastic mode: the most restarts of any kind (default: no limit)");
  app.add_option("--blacklist-cooldown-range", raw.blacklist_cooldown,
                 "Elastic mode: MIN MAX seconds a host that failed twice is left out (default: "
                 "for good)")
      ->allow_extra_args(false);
  app.add_option("--heartbeat-timeout", raw.heartbeat_timeout,
                 "Seconds of silence after which a host or the launcher is lost (default 10)");
  app.add_option("--master-port", raw.master_port, "MASTER_PORT (default: a free port)");
  app.add_option("--wdir,--cwd", raw.working_directory, "Working directory of the ranks");
  app.add_flag("--display-map", raw.display_map, "Print where each rank runs");
  app.add_flag("--check", raw.check,
               "Check every host (reachable, GPUs busy, ports taken) and start nothing");
  app.add_flag("--json", raw.json, "With --check: print one JSON document");
  app.add_flag("--no-preflight", raw.no_preflight,
               "Skip the quick check of ports and busy GPUs before a launch");
  app.add_option("--gpu-busy-threshold", raw.gpu_busy_threshold,
                 "MiB that other processes may use on a GPU before it counts as busy (256)");
  app.add_option("--rsh,--launch-agent-rsh", raw.rsh,
                 "How to reach other hosts: libssh2 (default), ssh (OpenSSH), or a program "
                 "taking HOST COMMAND");
  app.add_option("--launch-agent", raw.launch_agent,
                 "auto (srun for a Slurm allocation's hosts, else --rsh), ssh or srun");
  app.add_option("--ssh-identity", raw.ssh_identity, "Private key to log in with (tried first)");
  app.add_option("--ssh-user", raw.ssh_user, "User on other hosts (user@host in -H wins)");
  app.add_option("--ssh-port", raw.ssh_port, "SSH port of other hosts (default 22)");
  app.add_flag("--ssh-accept-new", raw.ssh_accept_new,
               "Trust and record host keys not yet in ~/.ssh/known_hosts (never changed ones)");
  app.add_option("--ssh-connect-timeout", raw.ssh_timeout, "Seconds to reach a host (default 10)");
  app.add_option("--remote-perseusrun", raw.remote_program,
                 "perseusrun's path on other hosts (default: the same as here)");
  app.add_option("--addr", raw.address, "This machine's address as the other hosts reach it");
  app.add_option("--iface", raw.interface, "Take this machine's address from this interface");
  app.add_flag("-v,--verbose", raw.verbose, "Say more about what perseusrun does");
  app.add_flag("-h,--help", raw.help, "Show this help");
  app.add_flag("--version", raw.version, "Show versions");
  app.add_option("--bind-to", raw.bind_to, "Accepted for mpirun scripts; perseusrun does not bind");
  app.add_flag("--allow-run-as-root,--tag-output", raw.ignored,
               "Accepted for mpirun scripts (no effect)");
}

// Number of words an option takes after it: 0 for flags, 2 for -mca, else 1.
int value_count(const CLI::Option *option) {
  if (option->get_expected_min() == 0) return 0;
  return std::max(1, option->get_type_size_max());
}

const CLI::Option *find_option(const CLI::App &app, const std::string &word) {
  for (const CLI::Option *option : app.get_options()) {
    if (option->check_name(word)) return option;
  }
  return nullptr;
}

// Rewrites mpirun's single-dash long options ("-np") to CLI11's spelling ("--np") and cuts
// the arguments at the program. Returns the options in CLI11's reversed order. An option word
// that names no option throws InputError with the closest name.
std::vector<std::string> split_options(const CLI::App &app, const std::vector<std::string> &args,
                                       std::vector<std::string> &command);

std::string suggestion(const CLI::App &app, const std::string &word) {
  std::string best;
  size_t best_distance = 3;
  for (const CLI::Option *option : app.get_options()) {
    for (const std::string &name : option->get_lnames()) {
      const size_t distance = launch::edit_distance(word.substr(word.find_first_not_of('-')), name);
      if (distance < best_distance) {
        best_distance = distance;
        best = "--" + name;
      }
    }
  }
  return best.empty() ? "" : " (did you mean " + best + "?)";
}

// Characters that look like '-' in documents (word processors turn "-np" into "–np").
struct DashLike {
  const char *utf8;
  const char *name;
};
constexpr DashLike kDashLikes[] = {
    {"\u2013", "an en dash (U+2013)"},
    {"\u2014", "an em dash (U+2014)"},
    {"\u2212", "a minus sign (U+2212)"},
    {"\u2010", "a hyphen (U+2010)"},
    {"\u2011", "a non-breaking hyphen (U+2011)"},
    {"\u2012", "a figure dash (U+2012)"},
    {"\u2015", "a horizontal bar (U+2015)"},
    {"\ufe63", "a small hyphen-minus (U+FE63)"},
    {"\uff0d", "a fullwidth hyphen-minus (U+FF0D)"},
};

const DashLike *dash_like_at(const std::string &word, size_t at) {
  for (const DashLike &dash : kDashLikes) {
    if (word.compare(at, std::strlen(dash.utf8), dash.utf8) == 0) return &dash;
  }
  return nullptr;
}

// True when `word` is an option word split_options accepts ("-np", "--np=4", "-x", "-xA=1").
bool names_option(const CLI::App &app, const std::string &word) {
  if (word.size() < 2 || word[0] != '-') return false;
  const std::string name = word.substr(0, word.find('='));
  if (find_option(app, name) || (word[1] != '-' && find_option(app, "-" + name))) return true;
  return word[1] != '-' && find_option(app, word.substr(0, 2));
}

// The program word "–np" is an option pasted from a document: refuse it, with the ASCII
// spelling when that names an option. After "--" a program may have any name.
void refuse_dash_like(const CLI::App &app, const std::string &word) {
  const DashLike *first = dash_like_at(word, 0);
  if (!first) return;
  std::string ascii;
  size_t at = 0;
  while (at < word.size()) {
    if (word[at] == '-') {
      ascii += '-';
      ++at;
    } else if (const DashLike *dash = dash_like_at(word, at)) {
      ascii += '-';
      at += std::strlen(dash->utf8);
    } else {
      break;
    }
  }
  ascii += word.substr(at);
  const std::string start = "'" + word + "' starts with " + first->name;
  if (names_option(app, ascii)) {
    throw InputError(start + ", not '-': did you mean " + ascii + "?");
  }
  throw InputError(start +
                   ", a dash-like character, not '-'; no program is run by that name: "
                   "type the dash as '-', or put -- before a program so named");
}

// "-np $UNSET" is an error, not the default.
[[noreturn]] void refuse_empty(const std::string &flag) {
  throw InputError(flag + " '': expected a value; leave " + flag + " out to get its default");
}

std::vector<std::string> split_options(const CLI::App &app, const std::vector<std::string> &args,
                                       std::vector<std::string> &command) {
  std::vector<std::string> options;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    std::string word = args[i];
    if (word == "--") {
      ++i;
      break;
    }
    if (word.size() < 2 || word[0] != '-') {
      refuse_dash_like(app, word);
      break;
    }
    const bool has_value = word.find('=') != std::string::npos;
    std::string name = word.substr(0, word.find('='));
    if (word[1] != '-' && name.size() > 2 && find_option(app, "-" + name)) {
      word = "-" + word;
      name = "-" + name;
    }
    const CLI::Option *option = find_option(app, name);
    const bool attached_short = !option && word[1] != '-' && find_option(app, word.substr(0, 2));
    if (!option && !attached_short) {
      throw InputError("unknown option '" + args[i] + "'" + suggestion(app, name) +
                       "; see perseusrun --help");
    }
    options.push_back(word);
    const std::string flag = args[i].substr(0, args[i].find('='));
    if (has_value && word.back() == '=') refuse_empty(flag);
    if (option && !has_value) {
      for (int v = 0; v < value_count(option) && i + 1 < args.size(); ++v) {
        options.push_back(args[++i]);
        if (options.back().empty()) refuse_empty(flag);
      }
    }
  }
  command.assign(args.begin() + static_cast<long>(i), args.end());
  std::reverse(options.begin(), options.end());
  return options;
}

int to_int(const std::string &value, const std::string &flag, int minimum,
           const std::string &what) {
  int number = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (error != std::errc() || end != value.data() + value.size() || number < minimum) {
    throw InputError(flag + " '" + value + "': expected " + what);
  }
  return number;
}

double to_seconds(const std::string &value, const std::string &flag) {
  std::istringstream stream(value);
  double seconds = -1;
  stream >> seconds;
  if (!stream || !stream.eof() || !(seconds >= 0) || !std::isfinite(seconds)) {
    throw InputError(flag + " '" + value + "': expected a number of seconds, e.g. " + flag + " 30");
  }
  return seconds;
}

double to_heartbeat_timeout(const std::string &value) {
  const double seconds = to_seconds(value, "--heartbeat-timeout");
  launch::heartbeat_timing(seconds, "--heartbeat-timeout '" + value + "'");
  return seconds;
}

template <typename Enum>
Enum to_choice(const std::string &value, const std::string &flag,
               const std::vector<std::pair<std::string, Enum>> &choices) {
  std::string names;
  for (const auto &[name, choice] : choices) {
    if (value == name) return choice;
    names += (names.empty() ? "" : ", ") + name;
  }
  throw InputError(flag + " '" + value + "': expected one of " + names);
}

void check_bind_to(const std::string &value) {
  if (value != "none") {
    fprintf(stderr,
            "perseusrun: warning: -bind-to %s: perseusrun does not bind ranks to cores; they run "
            "unbound, as with -bind-to none\n",
            value.c_str());
  }
}

// Words of a remote shell program as Open MPI's rsh agent setting writes it: "ssh : rsh" lists
// alternatives (the first found on PATH is used), each of them a program and its arguments.
std::vector<std::string> split_words(const std::string &text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

bool on_path(const std::string &program, const EnvironmentLookup &lookup) {
  if (program.find('/') != std::string::npos) return access(program.c_str(), X_OK) == 0;
  const std::string path = lookup("PATH").value_or("/usr/bin:/bin");
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find(':', start), path.size());
    const std::string dir = path.substr(start, end - start);
    if (access(((dir.empty() ? "." : dir) + "/" + program).c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

// --rsh, or the rsh agent of Open MPI's environment when --rsh is not given.
void set_remote_shell(const RawOptions &raw, const EnvironmentLookup &lookup,
                      launch::SshOptions &ssh) {
  std::string value = raw.rsh, origin = "--rsh";
  if (value.empty()) {
    for (const char *name :
         {"OMPI_MCA_plm_rsh_agent", "OMPI_MCA_orte_rsh_agent", "PRTE_MCA_plm_ssh_agent"}) {
      if (auto set = lookup(name); set && !set->empty()) {
        value = *set;
        origin = name;
        break;
      }
    }
  }
  if (value.empty() || value == "libssh2") {
    ssh.shell = launch::RemoteShell::kLibssh2;
    return;
  }
  std::vector<std::string> words;
  std::string tried;
  size_t start = 0;
  while (start <= value.size()) {
    const size_t end = std::min(value.find(':', start), value.size());
    std::vector<std::string> choice = split_words(value.substr(start, end - start));
    start = end + 1;
    if (choice.empty()) continue;
    // Only a value of alternatives is searched; a single program is taken as written, and a
    // missing one fails when the first host is reached, naming it.
    if (value.find(':') == std::string::npos || on_path(choice[0], lookup)) {
      words = std::move(choice);
      break;
    }
    tried += (tried.empty() ? "" : ", ") + choice[0];
  }
  if (words.empty()) {
    throw InputError(origin + " '" + value + "': none of " +
                     (tried.empty() ? std::string("its programs") : tried) +
                     " is on PATH; install one, or give --rsh libssh2");
  }
  if (words.size() == 1 && words[0] == "ssh") {
    ssh.shell = launch::RemoteShell::kOpenSsh;
    return;
  }
  ssh.shell = launch::RemoteShell::kProgram;
  ssh.rsh_program = std::move(words);
  ssh.rsh_origin = origin;
}

launch::ClusterEnvironment cluster_environment(const EnvironmentLookup &lookup) {
  const auto first = [&](std::initializer_list<const char *> names) {
    for (const char *name : names) {
      if (auto value = lookup(name); value && !value->empty()) {
        return std::pair<std::string, std::string>(name, *value);
      }
    }
    return std::pair<std::string, std::string>();
  };
  launch::ClusterEnvironment cluster;
  cluster.slurm_job_id = first({"SLURM_JOB_ID", "SLURM_JOBID"}).second;
  if (!cluster.slurm_job_id.empty()) {
    cluster.slurm_nodelist = first({"SLURM_JOB_NODELIST", "SLURM_NODELIST"}).second;
    cluster.slurm_tasks_per_node = first({"SLURM_TASKS_PER_NODE"}).second;
  }
  std::tie(cluster.default_hostfile_variable, cluster.default_hostfile) =
      first({"OMPI_MCA_orte_default_hostfile", "PRTE_MCA_prte_default_hostfile"});
  return cluster;
}

// horovodrun's elastic options (launch_config.h). They need --host-discovery-script, which
// replaces -H and -hostfile.
void set_elastic_options(const RawOptions &raw, launch::LaunchConfig &config) {
  config.host_discovery_script = raw.host_discovery_script;
  const bool elastic = !raw.host_discovery_script.empty();
  const auto needs_script = [&](const std::string &value, const char *flag) {
    if (!value.empty() && !elastic) {
      throw InputError(std::string(flag) + " " + value +
                       ": an elastic-mode option; give --host-discovery-script too");
    }
  };
  needs_script(raw.max_np, "--max-np");
  needs_script(raw.elastic_timeout, "--elastic-timeout");
  needs_script(raw.reset_limit, "--reset-limit");
  needs_script(raw.blacklist_cooldown.empty() ? "" : raw.blacklist_cooldown.back().first,
               "--blacklist-cooldown-range");
  if (elastic && (!raw.hosts.empty() || !raw.hostfile.empty())) {
    throw InputError("--host-discovery-script " + raw.host_discovery_script + " and " +
                     (raw.hosts.empty() ? "-hostfile " + raw.hostfile : "-H") +
                     " both name hosts; in elastic mode the script names them, give one");
  }
  if (!raw.max_np.empty()) {
    config.max_np = to_int(raw.max_np, "--max-np", 1, "a number of ranks of at least 1");
    if (config.min_np > config.max_np) {
      throw InputError("--min-np " + raw.min_np + " is more than --max-np " + raw.max_np);
    }
    if (config.np > config.max_np) {
      throw InputError("-np " + raw.np + " is more than --max-np " + raw.max_np +
                       ": -np is the starting size, between --min-np and --max-np");
    }
  }
  if (!raw.elastic_timeout.empty()) {
    config.elastic_timeout_seconds = to_seconds(raw.elastic_timeout, "--elastic-timeout");
  }
  if (!raw.reset_limit.empty()) {
    config.reset_limit =
        to_int(raw.reset_limit, "--reset-limit", 0, "a number of restarts of at least 0");
  }
  if (!raw.blacklist_cooldown.empty()) {
    const auto &[low, high] = raw.blacklist_cooldown.back();
    const std::string both = low + " " + high;
    const char *expected = "MIN MAX, whole seconds, 1 <= MIN <= MAX";
    config.blacklist_cooldown_min = to_int(low, "--blacklist-cooldown-range", 1, expected);
    config.blacklist_cooldown_max = to_int(high, "--blacklist-cooldown-range", 1, expected);
    if (config.blacklist_cooldown_min > config.blacklist_cooldown_max) {
      throw InputError("--blacklist-cooldown-range '" + both + "': expected " + expected);
    }
  }
}

launch::LaunchConfig to_config(const RawOptions &raw, std::vector<std::string> command,
                               const EnvironmentLookup &lookup) {
  launch::LaunchConfig config;
  config.cluster = cluster_environment(lookup);
  if (!raw.np.empty()) {
    config.np = to_int(raw.np, "-np", 1, "a number of ranks of at least 1");
    launch::check_rank_count(config.np, "-np " + raw.np);
  }
  if (!raw.npernode.empty()) {
    config.npernode = to_int(raw.npernode, "-npernode", 1, "a number of ranks of at least 1");
  }
  config.host_lists = raw.hosts;
  config.hostfile = raw.hostfile;
  config.map_by = to_choice<launch::MapBy>(
      raw.map_by, "--map-by", {{"slot", launch::MapBy::kSlot}, {"node", launch::MapBy::kNode}});
  config.gpu_bind = to_choice<launch::GpuBind>(raw.gpu_bind, "--gpu-bind",
                                               {{"list", launch::GpuBind::kList},
                                                {"isolate", launch::GpuBind::kIsolate},
                                                {"none", launch::GpuBind::kNone}});
  config.oversubscribe = raw.oversubscribe;
  config.exports = raw.exports;
  config.mca = raw.mca;
  config.output_directory = raw.output_directory;
  config.kill_grace_seconds = to_seconds(raw.kill_grace, "--kill-grace");
  if (!raw.timeout.empty()) config.timeout_seconds = to_seconds(raw.timeout, "--timeout");
  config.heartbeat_timeout_seconds = to_heartbeat_timeout(raw.heartbeat_timeout);
  if (!raw.max_restarts.empty()) {
    config.max_restarts = to_int(raw.max_restarts, "--max-restarts", 0,
                                 "a number of restarts from 0 to 10000, e.g. --max-restarts 3");
    if (config.max_restarts > 10000) {
      throw InputError("--max-restarts '" + raw.max_restarts +
                       "': expected a number of restarts from 0 to 10000");
    }
  }
  if (!raw.min_np.empty()) {
    config.min_np = to_int(raw.min_np, "--min-np", 1, "a number of ranks of at least 1");
    if (config.np && config.min_np > config.np) {
      throw InputError("--min-np " + raw.min_np + " is more than -np " + raw.np +
                       ": the fewest ranks cannot exceed the ranks asked for");
    }
  }
  set_elastic_options(raw, config);
  if (!raw.master_port.empty()) {
    config.master_port = to_int(raw.master_port, "--master-port", 1, "a port from 1 to 65535");
    if (config.master_port > 65535) {
      throw InputError("--master-port '" + raw.master_port + "': expected a port from 1 to 65535");
    }
  }
  config.working_directory = raw.working_directory;
  set_remote_shell(raw, lookup, config.ssh);
  config.ssh.launch_agent = to_choice<launch::AgentLaunch>(raw.launch_agent, "--launch-agent",
                                                           {{"auto", launch::AgentLaunch::kAuto},
                                                            {"ssh", launch::AgentLaunch::kSsh},
                                                            {"srun", launch::AgentLaunch::kSrun}});
  if (config.ssh.launch_agent == launch::AgentLaunch::kSrun &&
      config.cluster.slurm_job_id.empty()) {
    throw InputError(
        "--launch-agent srun: perseusrun is not inside a Slurm job (SLURM_JOB_ID is not set); "
        "run it within salloc or sbatch, or drop --launch-agent srun");
  }
  config.ssh.identity = raw.ssh_identity;
  config.ssh.user = raw.ssh_user;
  if (!raw.ssh_port.empty()) {
    config.ssh.port = to_int(raw.ssh_port, "--ssh-port", 1, "a port from 1 to 65535");
    if (config.ssh.port > 65535) {
      throw InputError("--ssh-port '" + raw.ssh_port + "': expected a port from 1 to 65535");
    }
  }
  config.ssh.accept_new = raw.ssh_accept_new;
  config.ssh.connect_timeout_seconds = to_seconds(raw.ssh_timeout, "--ssh-connect-timeout");
  config.ssh.remote_program = raw.remote_program;
  config.ssh.address = raw.address;
  config.ssh.interface = raw.interface;
  config.display_map = raw.display_map;
  config.verbose = raw.verbose;
  check_bind_to(raw.bind_to);
  config.check_only = raw.check;
  config.json = raw.json;
  config.preflight = !raw.no_preflight;
  if (!raw.gpu_busy_threshold.empty()) {
    config.gpu_busy_threshold_mib = static_cast<unsigned long long>(
        to_int(raw.gpu_busy_threshold, "--gpu-busy-threshold", 0, "a number of MiB, e.g. 1024"));
  }
  if (raw.json && !raw.check)
    throw InputError("--json goes with --check: perseusrun --check --json");
  if (raw.check) {
    if (!command.empty()) {
      throw InputError("--check starts nothing, but a program was given ('" + command[0] +
                       "'); drop one of them");
    }
    return config;
  }
  if (command.empty()) {
    throw InputError("no program to run; usage: perseusrun [options] [--] program [args...]");
  }
  config.command = std::move(command);
  return config;
}

}  // namespace

EnvironmentLookup process_environment() {
  return [](const std::string &name) -> std::optional<std::string> {
    const char *value = getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

CommandLine parse_command_line(const std::vector<std::string> &args,
                               const EnvironmentLookup &environment) {
  CommandLine result;
  if (!args.empty() && args[0] == "--agent") {
    result.mode = Mode::kAgent;
    return result;
  }
  CLI::App app(kDescription, "perseusrun");
  app.set_help_flag();
  RawOptions raw;
  add_options(app, raw);
  std::vector<std::string> command;
  std::vector<std::string> options = split_options(app, args, command);
  try {
    app.parse(options);
  } catch (const CLI::ParseError &error) {
    throw InputError(std::string(error.what()) + "; see perseusrun --help");
  }
  if (raw.help) {
    result.mode = Mode::kHelp;
  } else if (raw.version) {
    result.mode = Mode::kVersion;
  } else {
    result.config = to_config(raw, std::move(command), environment);
  }
  return result;
}

std::string help_text() {
  CLI::App app(kDescription, "perseusrun");
  app.set_help_flag();
  RawOptions raw;
  add_options(app, raw);
  app.formatter(std::make_shared<HelpFormatter>());
  app.footer(kExamples);
  return app.help();
}

// CUDA and NCCL are not part of the build: libperseus loads whichever a rank's host has
// (lib/comm/nccl/cuda_api.cc, nccl_api.cc), so the text says which files it looks for.
std::string version_text() {
  return std::string("perseusrun ") + PERSEUS_VERSION + "\n" +
         "CUDA: not linked; libperseus loads libcudart.so.13, .so.12 or .so at run time\n" +
         "NCCL: not linked; libperseus loads libnccl.so.2 at run time\n" +
         "libssh2: " + LIBSSH2_VERSION + "\n";
}

}  // namespace perseus::app

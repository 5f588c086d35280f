#pragma once
// Everything perseusrun was asked to do, as plain data. apps/perseusrun fills it from the
// command line; lib/launch validates what depends on the hosts.

#include <string>
#include <utility>
#include <vector>

#include "lib/launch/planning/gpu_allotment.h"
#include "lib/launch/planning/placement.h"
#include "lib/launch/ssh_options.h"

namespace perseus::launch {

// The most ranks one job may have (-np, or the slots): the launcher's memory and the job
// description stay small below it (docs/USAGE.md).
inline constexpr int kMaxRanks = 65536;

// Throws InputError when `np` ranks are more than kMaxRanks; `source` says where the number
// came from ("-np 1000000", "the 70000 slots").
void check_rank_count(long long np, const std::string &source);

// What the cluster engine around perseusrun says, read from its environment by apps/perseusrun:
// a Slurm job's nodes and tasks per node (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE), and Open
// MPI's default hostfile (OMPI_MCA_orte_default_hostfile, as Kubeflow's MPIJob sets it). Used
// when neither -H nor -hostfile names hosts, in that order (host_mentions in job_plan.h).
struct ClusterEnvironment {
  std::string slurm_job_id;               // SLURM_JOB_ID; empty outside a Slurm job
  std::string slurm_nodelist;             // empty: not in an allocation
  std::string slurm_tasks_per_node;       // SLURM_TASKS_PER_NODE
  std::string default_hostfile;           // the file's path
  std::string default_hostfile_variable;  // the variable that named it, for messages
};

struct LaunchConfig {
  int np = 0;                           // 0: the total slots
  std::vector<std::string> host_lists;  // each -H value
  std::string hostfile;
  int npernode = 0;
  MapBy map_by = MapBy::kSlot;
  bool oversubscribe = false;
  GpuBind gpu_bind = GpuBind::kList;
  std::vector<std::string> exports;                      // -x values as written
  std::vector<std::pair<std::string, std::string>> mca;  // -mca NAME VALUE
  std::string output_directory;
  double kill_grace_seconds = 5;
  double timeout_seconds = 0;  // 0: none
  // --max-restarts: restarts of every rank after a rank fails or a host is lost (torchrun's
  // model), on the hosts still alive; --min-np: the fewest ranks a restart may run with.
  int max_restarts = -1;  // -1: not given (0 restarts; in elastic mode, no limit)
  int min_np = 0;         // 0: 1
  // horovodrun's elastic mode: hosts from --host-discovery-script, read again every second; the
  // job restarts on the new set of hosts when they change, with at most --max-np ranks, after
  // waiting up to --elastic-timeout for hosts enough for --min-np; --reset-limit caps the
  // restarts of every kind; a host that fails twice is blacklisted (for good, or for
  // --blacklist-cooldown-range's MIN seconds, doubled each time up to MAX).
  std::string host_discovery_script;
  int max_np = 0;  // 0: no limit
  double elastic_timeout_seconds = 600;
  int reset_limit = -1;  // -1: no limit
  int blacklist_cooldown_min = 0;
  int blacklist_cooldown_max = 0;  // 0: blacklisted for good
  int master_port = 0;             // 0: pick a free one
  // --heartbeat-timeout (heartbeat.h)
  double heartbeat_timeout_seconds = 10;
  std::string working_directory;
  bool display_map = false;
  bool verbose = false;
  std::vector<std::string> command;  // program and its arguments
  std::string agent_program;         // this binary, started as the agent on each host
  SshOptions ssh;
  ClusterEnvironment cluster;
  bool preflight = true;                            // --no-preflight turns it off
  unsigned long long gpu_busy_threshold_mib = 256;  // --gpu-busy-threshold
  bool check_only = false;                          // --check
  bool json = false;                                // --json (with --check)
};

}  // namespace perseus::launch

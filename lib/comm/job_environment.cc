#include "lib/comm/job_environment.h"

#include <charconv>
#include <limits>

#include "lib/comm/error.h"
#include "lib/rendezvous/job_contract.h"

namespace perseus::comm {

namespace {

// Set by Open MPI, PMIx, Slurm, MPICH's Hydra, torchrun and horovodrun for each rank they
// start (perseusrun's own: contract::kLauncherVariables). Only the ones that place a rank: tuning
// variables (PERSEUS_SHM, OMPI_MCA_*) are often exported for every shell.
constexpr const char *kOtherLaunchersVariables[] = {"OMPI_COMM_WORLD_SIZE",
                                                    "OMPI_COMM_WORLD_RANK",
                                                    "OMPI_COMM_WORLD_LOCAL_RANK",
                                                    "OMPI_COMM_WORLD_LOCAL_SIZE",
                                                    "OMPI_COMM_WORLD_NODE_RANK",
                                                    "PMIX_RANK",
                                                    "PMIX_NAMESPACE",
                                                    "SLURM_PROCID",
                                                    "SLURM_NTASKS",
                                                    "PMI_RANK",
                                                    "PMI_SIZE",
                                                    "RANK",
                                                    "WORLD_SIZE",
                                                    "LOCAL_RANK",
                                                    "LOCAL_WORLD_SIZE",
                                                    "TORCHELASTIC_RUN_ID",
                                                    "HOROVOD_RANK",
                                                    "HOROVOD_SIZE"};

std::string required(Lookup lookup, const char *name) {
  const char *value = lookup(name);
  if (!value || !*value) {
    const std::string found = launcher_variables(lookup);
    throw Error(Code::kRendezvous,
                std::string(name) +
                    " is not set: libperseus learns its place in the job from its launcher, and "
                    "this process has " +
                    (found.empty() ? "none of perseusrun's variables"
                                   : "a launcher's variables (" + found +
                                         ") but not this one of perseusrun's") +
                    ". Start the program under perseusrun (perseusrun -np N program ...), or "
                    "under Open MPI's mpirun or Slurm's srun; or unset those variables to run it "
                    "alone, as a job of one rank");
  }
  return value;
}

// A whole decimal int in [low, high], else Error(code) naming the variable and the value.
int parse_int(const std::string &text, const char *name, int low, int high, Code code) {
  int value = 0;
  const char *end = text.data() + text.size();
  const auto [at, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || at != end || value < low || value > high) {
    throw Error(code, std::string(name) + "='" + text + "' is not a whole number in [" +
                          std::to_string(low) + ", " + std::to_string(high) + "]");
  }
  return value;
}

int required_int(Lookup lookup, const char *name, int low, int high) {
  return parse_int(required(lookup, name), name, low, high, Code::kRendezvous);
}

std::chrono::milliseconds seconds_or(Lookup lookup, const char *name,
                                     std::chrono::milliseconds fallback) {
  const char *value = lookup(name);
  if (!value || !*value) return fallback;
  constexpr int kMaxSeconds = 7 * 24 * 3600;
  return std::chrono::seconds(parse_int(value, name, 1, kMaxSeconds, Code::kInvalidArgument));
}

// Ranks and sizes must agree with each other; perseusrun always sets them so, but a user may
// have copied a few variables by hand.
void check_places(const JobEnvironment &e) {
  const auto place = [](int rank, int size, const char *rank_name, const char *size_name) {
    if (rank >= size) {
      throw Error(Code::kRendezvous, std::string(rank_name) + "/" + size_name + ": rank " +
                                         std::to_string(rank) + " is not below its size " +
                                         std::to_string(size) +
                                         ": the PERSEUS_* variables disagree");
    }
  };
  place(e.rank, e.size, contract::kRank, contract::kSize);
  place(e.local_rank, e.local_size, contract::kLocalRank, contract::kLocalSize);
  place(e.cross_rank, e.cross_size, contract::kCrossRank, contract::kCrossSize);
}

}  // namespace

JobEnvironment read_job_environment(Lookup lookup) {
  constexpr int kMax = std::numeric_limits<int>::max();
  JobEnvironment e;
  // The rendezvous address first: its absence means "not under perseusrun", the one message
  // a user starting the program by hand needs.
  e.rendezvous_addr = required(lookup, contract::kRendezvousAddr);
  e.rendezvous_port = required_int(lookup, contract::kRendezvousPort, 1, 65535);
  e.secret_file = required(lookup, contract::kSecretFile);
  e.rank = required_int(lookup, contract::kRank, 0, kMax);
  e.size = required_int(lookup, contract::kSize, 1, kMax);
  e.local_rank = required_int(lookup, contract::kLocalRank, 0, kMax);
  e.local_size = required_int(lookup, contract::kLocalSize, 1, kMax);
  e.cross_rank = required_int(lookup, contract::kCrossRank, 0, kMax);
  e.cross_size = required_int(lookup, contract::kCrossSize, 1, kMax);
  const char *node_rank = lookup(contract::kNodeRank);
  if (node_rank && *node_rank) {
    e.node_rank = parse_int(node_rank, contract::kNodeRank, 0, kMax, Code::kRendezvous);
  }
  const char *job_id = lookup(contract::kJobId);
  e.job_id = job_id ? job_id : "";
  const char *worker = lookup(contract::kElasticWorker);
  if (worker && *worker) {
    e.elastic_worker = parse_int(worker, contract::kElasticWorker, 0, kMax, Code::kRendezvous);
  }
  check_places(e);
  read_tuning(lookup, e);
  return e;
}

std::string launcher_variables(Lookup lookup) {
  std::string found;
  const auto add = [&](const char *name) {
    const char *value = lookup(name);
    if (value && *value) found += (found.empty() ? "" : ", ") + std::string(name) + "=" + value;
  };
  for (const char *name : contract::kLauncherVariables) add(name);
  for (const char *name : kOtherLaunchersVariables) add(name);
  return found;
}

JobEnvironment alone_job_environment(Lookup lookup) {
  JobEnvironment e;  // rank 0 of 1, locally and across hosts
  e.node_rank = 0;
  read_tuning(lookup, e);
  return e;
}

void read_tuning(Lookup lookup, JobEnvironment &job) {
  job.init_timeout = seconds_or(lookup, "PERSEUS_INIT_TIMEOUT", job.init_timeout);
  job.collective_timeout = seconds_or(lookup, "PERSEUS_COLLECTIVE_TIMEOUT", job.collective_timeout);
  const char *iface = lookup("PERSEUS_GLOO_IFACE");
  job.gloo_iface = iface ? iface : "";
}

}  // namespace perseus::comm

#pragma once
// What a rank learns from the environment perseusrun gives it
// (lib/launch/planning/rank_environment.cc): its place in the job and where the job's rendezvous
// store is, plus the user's tuning variables. libperseus and perseusrun meet only here and in
// lib/rendezvous.

#include <chrono>
#include <string>

namespace perseus::comm {

struct JobEnvironment {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
  // The number of this rank's host in the job (PERSEUS_NODE_RANK; from the host names under
  // MPI); -1 when the launcher did not say (perseus_init_with): ranks are then grouped by their
  // host's name.
  int node_rank = -1;
  std::string job_id;
  std::string rendezvous_addr;
  int rendezvous_port = 0;
  std::string secret_file;
  // An elastic job (perseusrun --host-discovery-script): this process's id for the whole job
  // (PERSEUS_ELASTIC_WORKER), -1 otherwise. Its place (the fields above) is then the one the
  // store gives for the world it joins (elastic_world), not the environment's.
  int elastic_worker = -1;
  int elastic_world = -1;
  // The first world this process may join: one past the last it joined (a survivor that saw its
  // world break before perseusrun said so must not join that world again).
  int elastic_first_world = 0;
  // PERSEUS_INIT_TIMEOUT (s): the longest wait for the store and for the peers in perseus_init.
  std::chrono::milliseconds init_timeout{std::chrono::seconds(60)};
  // PERSEUS_COLLECTIVE_TIMEOUT (s): the longest wait for the peers in one collective. Long by
  // default, since blocking collectives also wait for ranks that are merely slower (a
  // checkpoint, an evaluation); a dead peer is noticed at once through its closed connection.
  std::chrono::milliseconds collective_timeout{std::chrono::seconds(1800)};
  // PERSEUS_GLOO_IFACE: a network interface for Gloo's connections instead of the address this
  // host uses to reach the rendezvous store.
  std::string gloo_iface;
};

using Lookup = const char *(*)(const char *name);

// Throws Error(kRendezvous) when perseusrun's variables are missing or malformed (naming the
// variable and the value, and the launcher variables that are set), Error(kInvalidArgument) for a
// malformed tuning variable.
JobEnvironment read_job_environment(Lookup lookup);

// The variables set here of a launcher that places ranks: perseusrun's PERSEUS_RANK and the
// like, Open MPI's OMPI_COMM_WORLD_*, PMIx's, Slurm's, MPICH's PMI_*, torchrun's RANK and
// WORLD_SIZE, horovodrun's HOROVOD_RANK ("RANK=1, WORLD_SIZE=2"); "" when none is: the process
// was started alone, and runs as a job of one rank (as Horovod's do).
std::string launcher_variables(Lookup lookup);

// The place of a process started alone: rank 0 of 1 (local and cross alike, host 0), with the
// tuning variables. Throws Error(kInvalidArgument) for a malformed tuning variable.
JobEnvironment alone_job_environment(Lookup lookup);

// Reads only the tuning variables (PERSEUS_INIT_TIMEOUT, PERSEUS_COLLECTIVE_TIMEOUT,
// PERSEUS_GLOO_IFACE) into `job`, leaving the rest; read_job_environment ends with it, and a job
// that MPI started (launcher_bootstrap.h) takes its place from MPI and its tuning from here. Throws
// Error(kInvalidArgument) for a malformed value, naming the variable.
void read_tuning(Lookup lookup, JobEnvironment &job);

}  // namespace perseus::comm

#pragma once
// The contract between perseusrun (lib/launch) and libperseus (lib/comm), in one place: the
// variables the launcher gives every rank and the library reads, the store keys the launcher
// publishes and the ranks watch, and where an installation or a build tree keeps libperseus
// beside the `perseus` package. Both sides spell these names only through this header.
// tests/unit/test_job_contract.cc holds the two sides to each other (the environment
// lib/launch makes for a rank, read back by lib/comm), and tests/shims/test_contract.py holds
// the Python package's copy (lib/framework_shims/perseus/_contract.py) to this file.
//
// A new rank variable: add it here, set it in lib/launch/planning/rank_environment.cc, read it in
// lib/comm/job_environment.cc (and in perseus/_contract.py if the Python package reads it),
// and add it to the contract test's expectations.

#include <string>

namespace perseus::contract {

// A rank's place in the job. PERSEUS_NODE_RANK is its host's number, PERSEUS_NUM_NODES the
// number of hosts (torchrun's GROUP_RANK and GROUP_WORLD_SIZE).
inline constexpr char kRank[] = "PERSEUS_RANK";
inline constexpr char kSize[] = "PERSEUS_SIZE";
inline constexpr char kLocalRank[] = "PERSEUS_LOCAL_RANK";
inline constexpr char kLocalSize[] = "PERSEUS_LOCAL_SIZE";
inline constexpr char kCrossRank[] = "PERSEUS_CROSS_RANK";
inline constexpr char kCrossSize[] = "PERSEUS_CROSS_SIZE";
inline constexpr char kNodeRank[] = "PERSEUS_NODE_RANK";
inline constexpr char kNumNodes[] = "PERSEUS_NUM_NODES";
inline constexpr char kJobId[] = "PERSEUS_JOB_ID";

// The job's store (lib/rendezvous) and the file that holds its secret: the agent writes the
// file (mode 0600) and names it here; the secret itself is never in an environment or on a
// command line.
inline constexpr char kRendezvousAddr[] = "PERSEUS_RENDEZVOUS_ADDR";
inline constexpr char kRendezvousPort[] = "PERSEUS_RENDEZVOUS_PORT";
inline constexpr char kSecretFile[] = "PERSEUS_SECRET_FILE";

// The libperseus a rank's `perseus` package loads: set by the launcher to the one it found
// beside itself, unless the user set it first.
inline constexpr char kLibrary[] = "PERSEUS_LIBRARY";

// The variables only a Perseus launcher sets for each rank it starts (not PERSEUS_LIBRARY,
// which users export too): one of them in a process means perseusrun started it.
inline constexpr const char *kLauncherVariables[] = {
    kRendezvousAddr, kRendezvousPort, kSecretFile, kRank,     kSize, kLocalRank,
    kLocalSize,      kCrossRank,      kCrossSize,  kNodeRank, kJobId};

// Store keys. When a rank's process ends, the launcher publishes how (a line of text) under
// exit_key(rank), and the first such line also under kFirstExitKey; ranks whose collectives
// wait on a peer read them to name the rank that ended.
inline constexpr char kFirstExitKey[] = "perseus/exit/first";
inline std::string exit_key(int rank) { return "perseus/exit/" + std::to_string(rank); }

// Elastic jobs (perseusrun --host-discovery-script). Every process gets an id of its own for the
// whole job (kElasticWorker); its place changes from one world to the next, so libperseus reads
// it from the store at each perseus_init: kElasticWorldKey holds the number of the latest world,
// elastic_place_key(world, id) the place ("rank size local_rank local_size cross_rank
// cross_size") of each process in it. A world's keys all lie under elastic_prefix(world),
// its exit notes too (elastic_prefix(world) + exit_key(rank)). When a world ends (a rank
// failed, a host was lost or added), the launcher sets elastic_ended_key(world) to why, and the
// ranks still in it fail what they wait for (Horovod's HorovodInternalError), then join the next
// world in the same process. A process that can do so (Horovod's elastic API, hvd.elastic.run)
// says so under elastic_ready_key(id); without that from every survivor, the launcher restarts
// every rank instead. kElasticHostsKey counts the changes of the discovered hosts that the
// running world has not yet taken in (HostsUpdatedInterrupt at the next commit).
inline constexpr char kElasticWorker[] = "PERSEUS_ELASTIC_WORKER";
inline constexpr char kElasticWorldKey[] = "perseus/elastic/world";
inline constexpr char kElasticHostsKey[] = "perseus/elastic/hosts_updated";
inline std::string elastic_prefix(int world) {
  return "perseus/elastic/" + std::to_string(world) + "/";
}
inline std::string elastic_place_key(int world, int worker) {
  return elastic_prefix(world) + "place/" + std::to_string(worker);
}
// The value under elastic_place_key, as lib/comm's join_elastic_world reads it.
inline std::string elastic_place_value(int rank, int size, int local_rank, int local_size,
                                       int cross_rank, int cross_size) {
  return std::to_string(rank) + " " + std::to_string(size) + " " + std::to_string(local_rank) +
         " " + std::to_string(local_size) + " " + std::to_string(cross_rank) + " " +
         std::to_string(cross_size);
}
inline std::string elastic_ended_key(int world) { return elastic_prefix(world) + "ended"; }
inline std::string elastic_ready_key(int worker) {
  return "perseus/elastic/ready/" + std::to_string(worker);
}

// Where libperseus lies: the package's own copy, relative to the folder that holds the
// `perseus` package (an installation, a wheel); and in a build tree, relative to the build
// folder (perseusrun is build/apps/perseusrun/perseusrun there).
inline constexpr char kPackagedLibrary[] = "perseus/lib/libperseus.so";
inline constexpr char kBuildTreeLibrary[] = "lib/comm/libperseus.so";

}  // namespace perseus::contract

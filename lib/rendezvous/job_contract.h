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

// Where libperseus lies: the package's own copy, relative to the folder that holds the
// `perseus` package (an installation, a wheel); and in a build tree, relative to the build
// folder (perseusrun is build/apps/perseusrun/perseusrun there).
inline constexpr char kPackagedLibrary[] = "perseus/lib/libperseus.so";
inline constexpr char kBuildTreeLibrary[] = "lib/comm/libperseus.so";

}  // namespace perseus::contract

#pragma once
// The messages of the launcher-agent protocol (the frames are in frame_channel.h).
//
//   agent                         launcher
//     Hello  ------------------------>     version and host facts (GPUs, cores)
//            <------------------------  Job          ranks of this host, argv, environment
//     Started, Output, Exited ------->     as they happen; Stdin/StdinEof/StdinAck for rank 0
//            <------------------------  Terminate    on failure, signal or timeout
//     Heartbeat <-------------------->     both ways while the job runs (heartbeat.h)
//     Done   ------------------------>     every process of the job on this host has ended
//
// Structured messages are CBOR maps; strings that must arrive byte for byte (argv, the
// environment) travel as CBOR byte strings, so that any byte but NUL passes unchanged. Output
// frames are raw: 4-byte rank, 1-byte stream, then the bytes. Decoding a malformed message
// throws LaunchError naming the peer.

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace perseus::launch {

inline constexpr int kProtocolVersion = 3;

struct Hello {
  std::string version;  // PERSEUS_VERSION of the agent
  int protocol = kProtocolVersion;
  std::string hostname;
  int cpu_count = 1;
  std::optional<int> gpu_count;                     // nullopt: no NVIDIA driver found
  std::optional<std::string> cuda_visible_devices;  // the host's own setting, if any
  int free_port = 0;  // a TCP port free on the host when the agent started (MASTER_PORT)
};

using EnvironmentChanges = std::vector<std::pair<std::string, std::string>>;

struct RankLaunch {
  int rank = 0;
  EnvironmentChanges environment;  // set on top of the agent's own environment
};

struct JobDescription {
  std::string job_id;
  std::string host_label;  // the host as the user named it, for messages
  std::vector<std::string> argv;
  std::string working_directory;
  int stdin_rank = -1;            // the rank that gets the launcher's stdin; -1: none on this host
  double kill_grace_seconds = 5;  // SIGTERM to SIGKILL, for leftovers and a lost launcher
  // The job's rendezvous secret: the agent writes it to a 0600 file for its ranks
  // (PERSEUS_SECRET_FILE) and removes it when the job ends. It never reaches a command line
  // or an environment variable.
  std::string secret;
  // Set for every rank, before the rank's own changes: what all ranks of the host share, so
  // that the description grows linearly with the ranks (job_plan.h).
  EnvironmentChanges common_environment;
  std::vector<RankLaunch> ranks;
  double heartbeat_timeout_seconds = 10;  // a launcher silent this long is lost (heartbeat.h)
  // An elastic job (--host-discovery-script): the agent stays when its ranks have ended, for
  // ranks the launcher may add (kAddRanks), until the launcher says Terminate.
  bool elastic = false;
};

// The variables perseusrun sets for one rank of `job`, lowest precedence first (a later entry
// of a name wins), in three layers that plan_job (job_plan.cc) orders so:
//   1. -x and -mca exports (exported_environment);
//   2. the rank variables (rank_environment.h: PERSEUS_*, RANK, OMPI_*, MASTER_*, ...), which
//      no -x overrides, and PERSEUS_LIBRARY / PYTHONPATH where perseusrun found its package;
//   3. CUDA_VISIBLE_DEVICES of the GPU binding (a -x of it chooses which devices are bound).
// The host's shared entries (common_environment) come first, then the rank's own; a name with a
// value per rank is kept whole in the rank's own list, so the order above holds. All of it lies
// over the agent's own environment, and the agent adds PERSEUS_SECRET_FILE last.
EnvironmentChanges rank_changes(const JobDescription &job, const RankLaunch &launch);

struct RankStarted {
  int rank = 0;
  int pid = 0;
};

struct RankExited {
  int rank = 0;
  int pid = 0;
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // the signal that ended it, or 0
};

struct AgentError {
  std::string message;
  int exit_code = 1;
};

struct Terminate {
  double grace_seconds = 5;
};

enum class OutputStream : uint8_t { kStdout = 1, kStderr = 2 };

struct OutputChunk {
  int rank = 0;
  OutputStream stream = OutputStream::kStdout;
  std::string bytes;
};

std::string encode(const Hello &message);
std::string encode(const JobDescription &message);
std::string encode(const RankStarted &message);
std::string encode(const RankExited &message);
std::string encode(const AgentError &message);
std::string encode(const Terminate &message);
std::string encode(const OutputChunk &message);
std::string encode_count(size_t count);

// `peer` names the sender in error messages.
Hello decode_hello(const std::string &payload, const std::string &peer);
JobDescription decode_job(const std::string &payload, const std::string &peer);
RankStarted decode_started(const std::string &payload, const std::string &peer);
RankExited decode_exited(const std::string &payload, const std::string &peer);
AgentError decode_error(const std::string &payload, const std::string &peer);
Terminate decode_terminate(const std::string &payload, const std::string &peer);
OutputChunk decode_output(const std::string &payload, const std::string &peer);
size_t decode_count(const std::string &payload, const std::string &peer);

}  // namespace perseus::launch

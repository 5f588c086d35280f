#include "lib/comm/launcher_bootstrap.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "lib/comm/error.h"
#include "lib/comm/host_places.h"
#include "lib/comm/mpi_library.h"
#include "lib/comm/pmi_library.h"

namespace perseus::comm {

namespace {

// What every rank tells the others (the channel's allgather, as bytes): its host name and its
// machine (kernel boot id and network namespace). Ranks sharing both are on one host (the places);
// sharing the machine, loopback reaches rank 0. Host names alone are not enough: containers
// and network namespaces of one machine often share its name, and are hosts of their own.
struct HostRecord {
  char host[256];
  char machine[128];
};

// What rank 0 tells the others (the channel's broadcast, as bytes): its store, or why it has none.
struct StoreRecord {
  char address[64];
  int32_t port;
  uint8_t secret[rendezvous::kSecretSize];
  char error[1024];
};

// The process's one exchange (see bootstrap_through_launcher). Never destroyed: rank 0's store must
// outlive every rank's last perseus_init, and a server thread joined from a static destructor
// could wait on ranks that are gone.
struct Cache {
  std::mutex mutex;
  std::optional<LauncherBootstrap> joined;
};

Cache &cache() {
  static auto *instance = new Cache;
  return *instance;
}

std::string value_of(Lookup lookup, const char *name) {
  const char *value = lookup(name);
  return value ? value : "";
}

std::string named(const char *name, const std::string &value) {
  return std::string(name) + "=" + value;
}

// The launcher that started this process, as its variables say, and how the bootstrap meets the
// other ranks under it.
enum class Launcher { kNone, kMpirun, kPmi2, kPmix, kSrun };

struct LauncherFound {
  Launcher kind = Launcher::kNone;
  std::string description;  // "Open MPI's mpirun (OMPI_COMM_WORLD_SIZE=2)", for messages
};

LauncherFound launcher_of(Lookup lookup) {
  if (const auto size = value_of(lookup, "OMPI_COMM_WORLD_SIZE"); !size.empty()) {
    return {Launcher::kMpirun, "Open MPI's mpirun (" + named("OMPI_COMM_WORLD_SIZE", size) + ")"};
  }
  // srun --mpi=pmi2 gives each task the socket of its step's PMI2 server.
  if (const auto rank = value_of(lookup, "PMI_RANK");
      !rank.empty() && !value_of(lookup, "PMI_FD").empty()) {
    return {Launcher::kPmi2, "Slurm's srun with PMI2 (" + named("PMI_RANK", rank) + ")"};
  }
  if (const auto rank = value_of(lookup, "PMIX_RANK"); !rank.empty()) {
    return {Launcher::kPmix, "a PMIx launcher (" + named("PMIX_RANK", rank) + ")"};
  }
  const auto proc = value_of(lookup, "SLURM_PROCID");
  const auto tasks = value_of(lookup, "SLURM_NTASKS");
  if (!proc.empty() && !tasks.empty()) {
    return {Launcher::kSrun, "Slurm's srun (" + named("SLURM_PROCID", proc) + ", " +
                                 named("SLURM_NTASKS", tasks) + ")"};
  }
  return {};
}

// The number of ranks the launcher announced and the variable that says so ("SLURM_NTASKS=4"),
// or 0 when none does.
int announced_size(Lookup lookup, std::string &variable) {
  for (const char *name : {"OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}) {
    const std::string text = value_of(lookup, name);
    int size = 0;
    const auto [at, ec] = std::from_chars(text.data(), text.data() + text.size(), size);
    if (!text.empty() && ec == std::errc() && at == text.data() + text.size()) {
      variable = named(name, text);
      return size;
    }
  }
  return 0;
}

// The client library to load: the one `variable` names, else `defaults` in order.
std::vector<std::string> library_names(Lookup lookup, const char *variable,
                                       std::vector<std::string> defaults) {
  const std::string chosen = value_of(lookup, variable);
  if (!chosen.empty()) return {chosen};
  return defaults;
}

// The two collectives the bootstrap needs from the launcher's process manager, over every rank.
class LauncherChannel {
 public:
  virtual ~LauncherChannel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // `bytes` of each rank into `out` (bytes * size), in rank order.
  virtual void allgather(const void *in, void *out, int bytes) = 0;
  // `bytes` of rank 0's `buffer` into every rank's.
  virtual void broadcast(void *buffer, int bytes) = 0;
  // The end of the exchange, reached by every rank.
  virtual void finish() = 0;
};

// MPI_COMM_WORLD, initialised here unless the program did (see the header for the finalise).
class MpiChannel : public LauncherChannel {
 public:
  MpiChannel(Lookup lookup, const std::string &launcher)
      : mpi_(MpiLibrary::open(
            library_names(lookup, "PERSEUS_MPI_LIBRARY", {"libmpi.so.40", "libmpi.so"}),
            "started under " + launcher)) {
    if (mpi_.finalized()) {
      throw Error(Code::kRendezvous, "started under " + launcher +
                                         ", but this process has already called MPI_Finalize (" +
                                         mpi_.path() +
                                         "): libperseus meets the other ranks through MPI, so "
                                         "call perseus_init before MPI_Finalize");
    }
    ours_ = !mpi_.initialized();
    if (ours_) mpi_.init_thread();
  }
  int rank() const override { return mpi_.rank(); }
  int size() const override { return mpi_.size(); }
  void allgather(const void *in, void *out, int bytes) override { mpi_.allgather(in, out, bytes); }
  void broadcast(void *buffer, int bytes) override { mpi_.broadcast(buffer, bytes, 0); }
  // Every rank gets here (no rank throws between its collectives), so the finalise cannot wait
  // on a rank that left: MPI_Finalize is collective in Open MPI (a fence).
  void finish() override {
    if (ours_) mpi_.finalize();
  }

 private:
  MpiLibrary mpi_;
  bool ours_ = false;
};

// The process manager's key-value space (PMI2's or PMIx's): a put and a fence make each
// collective.
template <typename Library>
class PmiChannel : public LauncherChannel {
 public:
  PmiChannel(std::vector<std::string> names, const std::string &launcher)
      : pmi_(Library::open(names, "started under " + launcher)) {
    pmi_.init();
  }
  int rank() const override { return pmi_.rank(); }
  int size() const override { return pmi_.size(); }
  void allgather(const void *in, void *out, int bytes) override {
    // One key space for the whole job: each rank's value under a key of its own.
    const std::string key = "perseus-gather-" + std::to_string(round_++) + "-";
    pmi_.put_bytes(key + std::to_string(rank()), in, static_cast<size_t>(bytes));
    pmi_.fence();
    auto *all = static_cast<char *>(out);
    for (int r = 0; r < size(); ++r) {
      pmi_.get_bytes(r, key + std::to_string(r),
                     all + static_cast<size_t>(r) * static_cast<size_t>(bytes),
                     static_cast<size_t>(bytes));
    }
  }
  void broadcast(void *buffer, int bytes) override {
    const std::string key = "perseus-bcast-" + std::to_string(round_++);
    if (rank() == 0) pmi_.put_bytes(key, buffer, static_cast<size_t>(bytes));
    pmi_.fence();
    if (rank() != 0) pmi_.get_bytes(0, key, buffer, static_cast<size_t>(bytes));
  }
  void finish() override { pmi_.finalize(); }

 private:
  Library pmi_;
  int round_ = 0;
};

// Copies text into a fixed field, always terminated (longer text is cut).
template <size_t N>
void put(char (&field)[N], const std::string &text) {
  const size_t length = std::min(text.size(), N - 1);
  std::memcpy(field, text.data(), length);
  field[length] = '\0';
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) {
    throw Error(Code::kRendezvous, std::string("gethostname failed: ") + strerror(errno));
  }
  return name;
}

// This kernel and network namespace: ranks that share both reach each other on loopback.
std::string machine_identity() {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  char network[64] = {};
  const ssize_t length = readlink("/proc/self/ns/net", network, sizeof network - 1);
  return boot_id + " " + (length > 0 ? std::string(network, static_cast<size_t>(length)) : "");
}

std::vector<HostRecord> gather_hosts(LauncherChannel &channel, int size) {
  HostRecord mine{};
  put(mine.host, host_name());
  put(mine.machine, machine_identity());
  std::vector<HostRecord> all(static_cast<size_t>(size));
  channel.allgather(&mine, all.data(), static_cast<int>(sizeof mine));
  return all;
}

bool one_machine(const std::vector<HostRecord> &hosts) {
  return std::all_of(hosts.begin(), hosts.end(), [&](const HostRecord &h) {
    return std::strcmp(h.machine, hosts[0].machine) == 0 && *h.machine;
  });
}

std::string text_of(const in_addr &address) {
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &address, text, sizeof text);
  return text;
}

bool is_loopback(const in_addr &address) { return (ntohl(address.s_addr) >> 24) == 127; }

// The IPv4 address this host's name resolves to, unless that is loopback (Debian maps the host
// name to 127.0.1.1), else the first non-loopback interface that is up; "" when neither.
std::string cluster_address(const std::string &host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo *found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) == 0) {
    std::string address;
    for (const addrinfo *a = found; a && address.empty(); a = a->ai_next) {
      const in_addr ip = reinterpret_cast<const sockaddr_in *>(a->ai_addr)->sin_addr;
      if (!is_loopback(ip)) address = text_of(ip);
    }
    freeaddrinfo(found);
    if (!address.empty()) return address;
  }
  ifaddrs *interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return "";
  std::string address;
  for (const ifaddrs *i = interfaces; i && address.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
        (i->ifa_flags & IFF_LOOPBACK)) {
      continue;
    }
    address = text_of(reinterpret_cast<const sockaddr_in *>(i->ifa_addr)->sin_addr);
  }
  freeifaddrs(interfaces);
  return address;
}

// Where rank 0's store listens: an address every rank reaches.
std::string store_address(Lookup lookup, const std::vector<HostRecord> &hosts) {
  const std::string chosen = value_of(lookup, "PERSEUS_MPI_BOOTSTRAP_ADDR");
  if (!chosen.empty()) return chosen;
  if (one_machine(hosts)) return "127.0.0.1";
  const std::string address = cluster_address(hosts[0].host);
  if (address.empty()) {
    throw Error(Code::kRendezvous,
                "rank 0 (host " + std::string(hosts[0].host) +
                    ") found no non-loopback IPv4 address for the job's rendezvous store, which "
                    "ranks on other hosts must reach: set PERSEUS_MPI_BOOTSTRAP_ADDR to an "
                    "address of rank 0's host (mpirun -x PERSEUS_MPI_BOOTSTRAP_ADDR=...)");
  }
  return address;
}

// Rank 0: starts the store; a failure travels in the record, so that no rank waits in vain.
StoreRecord start_store(Lookup lookup, const std::vector<HostRecord> &hosts,
                        std::shared_ptr<rendezvous::Server> &server) {
  StoreRecord record{};
  std::string address;
  try {
    address = store_address(lookup, hosts);
    const rendezvous::Secret secret = rendezvous::random_secret();
    server = std::make_shared<rendezvous::Server>(secret, address);
    put(record.address, server->address());
    record.port = server->port();
    std::copy(secret.begin(), secret.end(), record.secret);
  } catch (const Error &error) {
    put(record.error, error.what());
  } catch (const rendezvous::WireError &error) {
    put(record.error, "rank 0 (host " + std::string(hosts[0].host) +
                          ") could not start the job's rendezvous store on " + address + ": " +
                          error.what() +
                          " (PERSEUS_MPI_BOOTSTRAP_ADDR names an address of rank 0's host)");
  }
  return record;
}

// A launcher's variables without the launcher (copied by hand, or srun without Open MPI's PMI
// support) make Open MPI start alone, as a job of one.
void check_size(int size, Lookup lookup, const std::string &launcher) {
  std::string variable;
  const int announced = announced_size(lookup, variable);
  if (announced != 0 && announced != size) {
    throw Error(Code::kRendezvous,
                "started under " + launcher + ", but the job joined has " + std::to_string(size) +
                    " rank(s), not the " + std::to_string(announced) + " that " + variable +
                    " announces: MPI did not join the launcher's job. Under srun, use srun "
                    "--mpi=pmi2 (no MPI needed) or --mpi=pmix; outside any launcher, unset the "
                    "OMPI_*/SLURM_* variables; or start the program under perseusrun");
  }
}

JobEnvironment place_of(int rank, const std::vector<HostRecord> &hosts, const StoreRecord &store,
                        Lookup lookup) {
  std::vector<std::string> names;
  for (const HostRecord &h : hosts) names.push_back(std::string(h.host) + '\n' + h.machine);
  const HostPlace place = place_among_hosts(names, rank);
  JobEnvironment job;
  job.rank = rank;
  job.size = static_cast<int>(hosts.size());
  job.local_rank = place.local_rank;
  job.local_size = place.local_size;
  job.cross_rank = place.cross_rank;
  job.cross_size = place.cross_size;
  job.node_rank = place.node;
  job.rendezvous_addr = store.address;
  job.rendezvous_port = store.port;
  for (const char *name : {"PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid", "SLURM_JOB_ID"}) {
    if (job.job_id.empty()) job.job_id = value_of(lookup, name);
  }
  return job;
}

// The one exchange through the launcher (see the header for why MPI is finalised at its end).
LauncherBootstrap exchange(Lookup lookup) {
  const LauncherFound found = launcher_of(lookup);
  const std::string &launcher = found.description;
  std::unique_ptr<LauncherChannel> channel;
  if (found.kind == Launcher::kPmi2) {
    channel = std::make_unique<PmiChannel<Pmi2Library>>(
        library_names(lookup, "PERSEUS_PMI2_LIBRARY", {"libpmi2.so.0", "libpmi2.so"}), launcher);
  } else if (found.kind == Launcher::kPmix && value_of(lookup, "PERSEUS_PMIX") != "0") {
    channel = std::make_unique<PmiChannel<PmixLibrary>>(
        library_names(lookup, "PERSEUS_PMIX_LIBRARY", {"libpmix.so.2", "libpmix.so"}), launcher);
  } else {
    // srun without a process manager (--mpi=none) leaves MPI to join the step.
    channel = std::make_unique<MpiChannel>(
        lookup, found.kind == Launcher::kSrun
                    ? launcher + " without PMI2 (srun --mpi=pmi2 joins without MPI)"
                    : launcher);
  }
  const int rank = channel->rank();
  const int size = channel->size();
  check_size(size, lookup, launcher);
  const std::vector<HostRecord> hosts = gather_hosts(*channel, size);
  LauncherBootstrap joined;
  StoreRecord store = rank == 0 ? start_store(lookup, hosts, joined.server) : StoreRecord{};
  channel->broadcast(&store, static_cast<int>(sizeof store));
  channel->finish();
  if (*store.error) throw Error(Code::kRendezvous, store.error);
  std::copy(std::begin(store.secret), std::end(store.secret), joined.secret.begin());
  explicit_bzero(store.secret, sizeof store.secret);
  joined.job = place_of(rank, hosts, store, lookup);
  return joined;
}

}  // namespace

bool started_by_other_launcher(Lookup lookup) {
  return value_of(lookup, "PERSEUS_RENDEZVOUS_ADDR").empty() &&
         launcher_of(lookup).kind != Launcher::kNone;
}

LauncherBootstrap bootstrap_through_launcher(Lookup lookup) {
  Cache &c = cache();
  std::lock_guard lock(c.mutex);
  if (!c.joined) c.joined = exchange(lookup);
  LauncherBootstrap result = *c.joined;
  read_tuning(lookup, result.job);
  return result;
}

}  // namespace perseus::comm

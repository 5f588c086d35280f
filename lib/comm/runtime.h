#pragma once
// One initialised libperseus: the rank's place in the job, its connection to the job's store
// and the engine (engine.h) that runs every operation. c_api.cc owns at most one, from
// perseus_init to perseus_finalize.
//
// The runtime checks each call's arguments (Error(kInvalidArgument) naming the argument and its
// value, before anything is submitted) and turns it into a Request for the engine.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "lib/comm/engine.h"
#include "lib/comm/job_environment.h"
#include "lib/comm/operation.h"
#include "lib/rendezvous/wire.h"

namespace perseus::rendezvous {
class Client;
}

namespace perseus::comm {

// Set when the process has begun to exit (an atexit handler perseus_init registers): the
// background thread then no longer touches the store.
std::atomic<bool> &process_exiting();

// The full shape the caller gave for this thread's next operation (perseus_next_shape), taken
// by the next submission; the C API's wrappers clear it after every call they make.
std::optional<std::vector<int64_t>> &next_shape();

class Runtime {
 public:
  // Joins the job: reads the secret, reaches the rendezvous store, connects the backend and
  // starts the engine. `generation` counts this process's perseus_init calls; it keeps the keys
  // of a second init apart from the first's. Throws Error.
  // `secret`: the job's secret when MPI brought it (launcher_bootstrap.h); nullopt: read from
  // job.secret_file, which perseusrun wrote.
  Runtime(JobEnvironment job, std::optional<rendezvous::Secret> secret, EngineSettings settings,
          int generation);
  // A job of one rank that no launcher started (started_alone() in job_environment.h): no
  // store, nothing listening and no thread but the engine's; every collective is a copy
  // (solo/backend.h), on host and device buffers alike. Throws Error.
  static std::unique_ptr<Runtime> alone(JobEnvironment job, EngineSettings settings,
                                        int generation);
  ~Runtime();

  const JobEnvironment &job() const { return job_; }

  // The operations of perseus.h: check, then submit. `name` may be null (a generated name).
  // process_set: 0 for every rank, else a number perseus_add_process_set gave.
  std::shared_ptr<Request> allreduce(const void *send, void *recv, size_t count, int dtype, int op,
                                     double prescale, double postscale, const char *name,
                                     int device, void *stream, int process_set = 0);
  std::shared_ptr<Request> broadcast(void *buffer, size_t count, int dtype, int root,
                                     const char *name, int device, void *stream,
                                     int process_set = 0);
  // Equal counts, into the caller's recv (the blocking perseus_allgather).
  void allgather(const void *send, void *recv, size_t count, int dtype, const char *name);
  std::shared_ptr<Request> allgatherv(const void *send, size_t count, int dtype, const char *name,
                                      int device, void *stream, int process_set = 0);
  // Collective over every rank: returns the new set's number (1, 2, ...).
  int add_process_set(const int *ranks, int count);
  // The members of process_set (every rank for 0), in rank order: the same on every rank.
  // Error(kInvalidArgument) for a set not made yet.
  std::vector<int> members_of(int process_set);
  // In a process set, send_counts / recv_counts hold one count per member, in rank order.
  std::shared_ptr<Request> alltoall(const void *send, const size_t *send_counts, int dtype,
                                    const char *name, int device, void *stream,
                                    int process_set = 0);
  std::shared_ptr<Request> reducescatter(const void *send, void *recv, const size_t *recv_counts,
                                         int dtype, int op, double prescale, double postscale,
                                         const char *name, int device, void *stream,
                                         int process_set = 0);
  void barrier(int process_set = 0);
  // Blocks until every rank has joined; returns the last rank to join.
  int join(int device);
  // Leaves the job (Engine::shutdown): false when the engine's thread did not end in time.
  bool shutdown();
  // Elastic jobs: whether the launcher has ended the world this runtime joined (its operations
  // fail; the process may join the next world after perseus_finalize).
  bool world_ended() const { return world_ended_; }
  // Elastic jobs: tells the launcher this process can join a new world in place (Horovod's
  // elastic API); how many times the discovered hosts changed so far.
  void declare_elastic();
  long long hosts_updated();

 private:
  // A request of `kind` in process_set (checked: this rank must be a member), its name
  // qualified by the set.
  std::shared_ptr<Request> make(OpKind kind, const char *name, int dtype, int device, void *stream,
                                int process_set = 0);
  std::shared_ptr<Request> submit(std::shared_ptr<Request> request);
  std::string lost_peers();
  std::string exit_notes(const std::vector<int> &ranks);
  void check_set(int process_set, Request &request);
  static void qualify(Request &request, int process_set);
  // The members of process_set (every rank for 0), in rank order; empty for a set not made.
  std::vector<int> members(int process_set);
  std::unique_ptr<shm::LocalAllreduce> open_local_allreduce(const EngineStore &store,
                                                            const EngineSettings &settings);

  struct Alone {};
  Runtime(JobEnvironment job, EngineSettings settings, int generation, Alone);

  JobEnvironment job_;
  // "" or, in an elastic job, the joined world's keys (contract::elastic_prefix).
  std::string world_keys_;
  std::atomic<bool> world_ended_{false};
  void join_elastic_world();
  void watch_for_ended_peers();
  void stop_watchdog();

  std::mutex store_mutex_;  // the store's one connection, shared by the engine and the watchdog
  std::unique_ptr<rendezvous::Client> store_;  // kept to learn which peer ended, after a failure
  // Alone: the keys the engine would put in the job's store (NCCL's id), under store_mutex_.
  std::map<std::string, std::string> own_keys_;
  std::unique_ptr<Engine> engine_;
  std::thread watchdog_;  // under perseusrun only (it writes the exit notes)
  std::mutex watchdog_mutex_;
  std::condition_variable watchdog_wake_;
  bool watchdog_stop_ = false;
};

}  // namespace perseus::comm

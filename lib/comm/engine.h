#pragma once
// The background thread that runs every operation (Horovod's model). Callers submit requests
// from any thread; the thread, once per cycle, tells the other ranks what is new here (one
// small allgather through the backend, a second one only when a message does not fit the
// first), feeds every rank's message to its Negotiator, and runs what every rank has submitted,
// in the agreed order, fusing small all-reduces into one buffer.
//
// Failures: an argument the ranks disagree on fails that operation on every rank and the job
// goes on. A backend failure (a peer lost, a transfer broken) is the job's end: every pending
// and later request fails with the same message, which names the peer that ended when the
// launcher has told (see `LostPeers`), and the backend is closed at once so that the other
// ranks notice too instead of waiting on this one.
//
// Ownership: the engine owns the backend and the thread; requests are shared with the callers'
// handles; their buffers are borrowed until the request is done.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lib/comm/job_environment.h"
#include "lib/comm/nccl/device_executor.h"
#include "lib/comm/negotiation.h"
#include "lib/comm/operation.h"
#include "lib/comm/timeline.h"
#include "lib/comm/transport/backend.h"

namespace perseus::comm {

struct EngineSettings {
  // PERSEUS_FUSION_THRESHOLD: all-reduces agreed in one cycle are packed into buffers of at
  // most this many bytes (0: no fusion).
  size_t fusion_threshold = 64 * 1024 * 1024;
  // PERSEUS_CYCLE_TIME: the longest an idle background thread sleeps before it checks with
  // the other ranks (new work wakes it at once). After a second without work it sleeps up to
  // five times longer, to spare the CPU of a rank that does not communicate.
  std::chrono::microseconds cycle_time{1000};
  // PERSEUS_STALL_CHECK_SECONDS (0: off): rank 0 warns about an operation some ranks have
  // submitted and others not for this long, naming them.
  std::chrono::seconds stall_check{60};
  // PERSEUS_STALL_SHUTDOWN_SECONDS (0: never): such an operation then fails on the ranks
  // that submitted it.
  std::chrono::seconds stall_shutdown{0};
  // PERSEUS_DEADLOCK_SECONDS (0: off): when every rank is blocked waiting for operations that
  // some rank never submitted (rank 0 in a barrier, rank 1 in an all-reduce), and no rank has
  // submitted anything for this long, every one of those operations fails on every rank,
  // naming who waits for what, instead of the job hanging.
  std::chrono::seconds deadlock{10};
  std::string timeline;  // PERSEUS_TIMELINE: a file name; rank 0 writes it
  // PERSEUS_SHM (1; 0 turns it off): host all-reduces through shared memory when every rank is
  // on one host.
  bool shared_memory = true;
  // PERSEUS_ALLREDUCE_STREAMS (1..64): device all-reduces (fused buffers) are spread over this
  // many CUDA streams, each with its own NCCL communicator and fusion buffer.
  int allreduce_streams = 1;
  // PERSEUS_HIERARCHICAL_ALLREDUCE (0; 1 turns it on; HOROVOD_HIERARCHICAL_ALLREDUCE is read
  // when it is unset): device all-reduces of a job over several hosts go in two levels, inside
  // each host and across hosts (nccl/hierarchy.h). Rank 0's setting holds for the job.
  bool hierarchical_allreduce = false;
  // PERSEUS_SHUTDOWN_TIMEOUT_SECONDS (0: no limit): how long perseus_finalize waits for the
  // background thread to leave the job with the others before it gives up on them.
  std::chrono::seconds shutdown_timeout{30};
};

// Reads the PERSEUS_* tuning variables above; Error(kInvalidArgument) naming a bad value.
EngineSettings read_engine_settings(Lookup lookup);

namespace shm {
class LocalAllreduce;
}

// The job's store as the engine's thread uses it (the NCCL communicator's id).
struct EngineStore {
  std::function<void(const std::string &key, const std::string &value)> set;
  std::function<std::string(const std::string &key, std::chrono::milliseconds timeout)> get;
  std::string prefix;  // keys of this perseus_init: "perseus/comm/<init number>/"
  // Connects the members of a new process set among themselves (collective among them).
  std::function<std::unique_ptr<transport::Backend>(int set, int rank_in_set, int set_size)>
      make_backend;
};

class Engine {
 public:
  // Called once, on the engine's thread, after a backend failure: which peers the launcher
  // says have ended, and how ("" when it cannot tell).
  using LostPeers = std::function<std::string()>;
  // What perseusrun says now of how these ranks ended ("" when it says nothing yet); must not
  // block for long. Null under another launcher, which writes no such notes.
  using ExitNotes = std::function<std::string(const std::vector<int> &ranks)>;

  Engine(const JobEnvironment &job, std::unique_ptr<transport::Backend> backend,
         EngineSettings settings, LostPeers lost_peers, EngineStore store,
         std::unique_ptr<shm::LocalAllreduce> local = nullptr, ExitNotes exit_notes = nullptr);
  // Stops the thread without agreement (shutdown() is the orderly way).
  ~Engine();
  Engine(const Engine &) = delete;
  Engine &operator=(const Engine &) = delete;

  // Hands the request to the thread. Throws Error(kInvalidArgument) when its name is already
  // in flight here, or the job's error when the engine has failed or is shutting down.
  void submit(const std::shared_ptr<Request> &request);
  // Joins (perseus_join): the request completes when every rank has joined.
  void join(const std::shared_ptr<Request> &request);
  // Leaves the job: the next cycle tells every rank, and the job is over for all of them (as in
  // Horovod): operations every rank had submitted by then still run, every other one fails on
  // every rank, naming this rank. Returns once the thread has ended, or false when it has not
  // within settings.shutdown_timeout (a peer that does not answer); the thread then runs on.
  bool shutdown();

  // Called from another thread when a peer is known to have ended: if some request has waited
  // longer than `after`, fails every request (the job's end, as a lost connection would), so
  // that callers never hang even when the transport misses the loss. The thread itself may stay
  // blocked in the transport; the process is expected to exit.
  void fail_if_stuck(const std::string &ended, std::chrono::milliseconds after);

  // Whether `rank` is a member of process set `set` (false for a set not made yet).
  bool member_of(int set, int rank);
  // The members of process set `set`, in rank order (empty for a set not made yet).
  std::vector<int> members_of(int set);

  // "<kind>.noname.<n>", n counting this process's unnamed operations of that kind in that
  // process set (so that a set's members count alike whatever the others do meanwhile).
  std::string unnamed(OpKind kind, int set = 0);

 private:
  void loop();
  void cycle();
  // Waits while a burst of submissions still grows (found: the requests queued now).
  void settle(size_t found) const;
  std::vector<RankMessage> exchange(const RankMessage &mine);
  void run(const std::vector<Agreed> &ready);
  void run_allreduces(const std::vector<const Agreed *> &group);
  void run_one(const Agreed &agreed);
  void fail_everything(Code code, const std::string &message);
  // The cycle saw these ranks leave (perseus_finalize): the job is over for this rank too.
  void note_departures(const std::vector<int> &ranks);
  // Why the thread ended, for the requests it fails: the departure of other ranks, waiting
  // briefly for the launcher's word on how they ended when some caller waits for the answer.
  std::pair<Code, std::string> end_reason();
  std::string departure_text(const std::vector<int> &left, bool wait_for_notes);
  // Throws the engine's failure (under `lock`), first waiting once for the launcher's word on
  // the ranks that left.
  [[noreturn]] void throw_failure(std::unique_lock<std::mutex> &lock);
  std::shared_ptr<Request> find(const std::string &name);
  void succeed(const std::shared_ptr<Request> &request);
  void fail(const std::shared_ptr<Request> &request, Code code, const std::string &message);
  void report_stalls();
  // Rank 0: cancels (next cycle) everything pending when the job is deadlocked.
  void end_deadlock(std::chrono::steady_clock::time_point now);
  // Whether a thread of this process waits for a request still in negotiation (checked at most
  // every kWaitingScan, the last answer otherwise).
  bool waiting_for_others();
  // Fails the requests rank 0 cancelled; a rank that never submitted an unnamed one skips its
  // number, so that the ranks' next unnamed operations of that kind match again.
  void fail_cancelled(const Negotiator::Cycle &agreed);
  nccl::DeviceExecutor &device(int ordinal);
  // Where every rank is, and whether rank 0 asks for hierarchical all-reduces: one allgather,
  // when the first device operation makes the communicators.
  nccl::HostLayout device_layout();
  void run_device_allreduces(const std::vector<const Agreed *> &group,
                             const std::vector<std::shared_ptr<Request>> &requests);
  void run_device_one(const Agreed &agreed, const std::shared_ptr<Request> &request);
  void host_allreduce(void *buffer, size_t count, DataType type, ReduceOp op);
  // Completes the device all-reduces the GPU has finished, oldest first; with `block`, waits
  // for all of them.
  void complete_device_work(bool block);
  transport::Backend *set_backend(int set);  // null: this rank alone in it
  int rank_in_set(int rank) const;           // in set_

  const JobEnvironment job_;
  const EngineSettings settings_;
  std::unique_ptr<transport::Backend> backend_;
  LostPeers lost_peers_;
  ExitNotes exit_notes_;
  EngineStore store_;
  std::unique_ptr<nccl::DeviceExecutor> device_;
  std::unique_ptr<shm::LocalAllreduce> local_;  // when every rank is on this host
  std::map<int, std::unique_ptr<transport::Backend>> set_backends_;  // sets this rank is in
  int set_ = 0;  // the process set of the operation running
  // Device all-reduces queued this cycle; then, with the marker of the streams' work after them,
  // until the GPU has done it (oldest first).
  std::vector<std::pair<std::string, std::shared_ptr<Request>>> device_queued_;
  struct DevicePending {
    nccl::DeviceExecutor::Marker marker;
    std::vector<std::pair<std::string, std::shared_ptr<Request>>> requests;
  };
  std::deque<DevicePending> device_pending_;
  Negotiator negotiator_;
  Timeline timeline_;

  // Shared with submitting threads, under mutex_.
  std::mutex mutex_;
  std::condition_variable work_;
  std::deque<std::shared_ptr<Request>> queue_;
  std::atomic<size_t> queued_{0};  // queue_.size(), readable without the lock
  std::map<std::string, std::shared_ptr<Request>> in_flight_;  // submitted, not done
  std::shared_ptr<Request> join_;
  bool join_announced_ = false;
  bool shutdown_ = false;
  bool stopped_ = false;  // the cycles have ended
  bool ended_ = false;    // the thread has done its last work
  std::condition_variable ended_signal_;
  std::vector<int> left_;    // other ranks that left the job (perseus_finalize) first
  bool left_noted_ = false;  // failure_ already holds what the launcher said of them
  Code failure_code_ = Code::kInternal;
  std::string failure_;                              // why the engine stopped; "" while it runs
  std::map<std::pair<int, int>, uint64_t> unnamed_;  // (kind, set) -> count, under mutex_
  std::vector<std::vector<int>> sets_;               // process sets made so far, for member_of()

  // The thread's own.
  std::vector<uint8_t> fusion_;
  std::vector<std::string> cancel_;  // rank 0: names to give up on, sent next cycle
  bool cancel_deadlock_ = false;     // rank 0: cancel_ ends a deadlock
  bool waiting_ = false;             // waiting_for_others()'s last answer
  std::chrono::steady_clock::time_point last_waiting_scan_;
  std::chrono::steady_clock::time_point last_stall_scan_;
  struct StallReport {
    std::chrono::steady_clock::time_point last;  // when it was last reported
    bool cancelled = false;                      // rank 0 has given up on it
  };
  std::map<std::string, StallReport> stall_reports_;  // rank 0: the operations stalled now
  std::chrono::steady_clock::time_point last_work_;
  int lone_cycles_ = 0;  // cycles in a row that found one request each (see kLoneCycles...)
  // Since when operations announced by some rank wait for others, without progress (see
  // kPendingPoll).
  std::chrono::steady_clock::time_point waiting_since_;
  std::thread thread_;
};

}  // namespace perseus::comm

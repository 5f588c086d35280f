#pragma once
// The background thread that runs every operation (Horovod's model). Callers submit requests
// from any thread; the thread, once per cycle, tells the other ranks what is new here (one
// small allgather through the host executor, a second one only when a message does not fit the
// first), feeds every rank's message to its Negotiator, and runs what every rank has submitted,
// in the agreed order, fusing small all-reduces into one buffer.
//
// Failures: an argument the ranks disagree on fails that operation on every rank and the job
// goes on. A backend failure (a peer lost, a transfer broken) is the job's end: every pending
// and later request fails with the same message, which names the peer that ended when the
// launcher has told (see `LostPeers`), and the connections are closed at once so that the other
// ranks notice too instead of waiting on this one.
//
// Ownership: the engine owns the executors (host memory's, and device memory's once a device
// operation comes) and the thread; requests are shared with the callers' handles; their
// buffers are borrowed until the request is done.

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

#include "lib/comm/engine_settings.h"
#include "lib/comm/host_executor.h"
#include "lib/comm/job_environment.h"
#include "lib/comm/nccl/device_executor.h"
#include "lib/comm/negotiation.h"
#include "lib/comm/operation.h"
#include "lib/comm/timeline.h"

namespace perseus::comm {

// The job's store as the engine's thread uses it (the NCCL communicator's id).
struct EngineStore {
  std::function<void(const std::string &key, const std::string &value)> set;
  std::function<std::string(const std::string &key, std::chrono::milliseconds timeout)> get;
  std::string prefix;  // keys of this perseus_init: "perseus/comm/<init number>/"
};

class Engine {
 public:
  // Called once, on the engine's thread, after a backend failure: which peers the launcher
  // says have ended, and how ("" when it cannot tell).
  using LostPeers = std::function<std::string()>;
  // What perseusrun says now of how these ranks ended ("" when it says nothing yet); must not
  // block for long. Null under another launcher, which writes no such notes.
  using ExitNotes = std::function<std::string(const std::vector<int> &ranks)>;

  // host: connected to every rank (the engine's own exchange goes through it too).
  Engine(const JobEnvironment &job, std::unique_ptr<HostExecutor> host, EngineSettings settings,
         LostPeers lost_peers, EngineStore store, ExitNotes exit_notes = nullptr);
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
  // The same, waiting at most `limit` for the thread (an elastic world that has ended: the thread
  // may wait on a peer that is gone, and the process goes on to the next world without it).
  bool shutdown(std::chrono::milliseconds limit);
  // Fails every pending and later request with `message` (the job's end for this engine), from
  // any thread: an elastic world that the launcher has ended.
  void abort(Code code, const std::string &message) { fail_everything(code, message); }

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
  // Why the thread ended, for the requests it fails: the departure of other ranks, with the
  // launcher's word on how they ended (awaited; see kExitNotePatience).
  std::pair<Code, std::string> end_reason();
  std::string departure_text(const std::vector<int> &left);
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
  // Completes the device all-reduces the GPU has finished, oldest first; with `block`, waits
  // for all of them.
  void complete_device_work(bool block);
  int rank_in_set(int set, int rank) const;  // its index among the set's members

  const JobEnvironment job_;
  const EngineSettings settings_;
  std::unique_ptr<HostExecutor> host_;
  LostPeers lost_peers_;
  ExitNotes exit_notes_;
  EngineStore store_;
  std::unique_ptr<nccl::DeviceExecutor> device_;
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

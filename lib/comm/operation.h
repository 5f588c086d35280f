#pragma once
// One named operation: what a rank asks for (Descriptor, which travels to the other ranks
// during negotiation) and the request that carries it inside this process (Request: the
// borrowed buffers, the result, the completion that perseus_wait blocks on).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/comm/error.h"
#include "lib/comm/types.h"

namespace perseus::comm {

enum class OpKind : uint8_t {
  kAllreduce = 0,
  kBroadcast = 1,
  kAllgatherv = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kBarrier = 5,
  kJoin = 6,
  kAddProcessSet = 7,  // counts: the set's ranks; the result (created_set) is the set's number
};
constexpr int kOpKinds = 8;

const char *name_of(OpKind kind);  // op_traits.cc

// Names libperseus gives operations. An unnamed one is "<kind>.noname.<n>", n counting this
// process's unnamed operations of that kind in that process set (Engine::unnamed); an operation
// in a process set other than 0 has " [process set <set>]" appended to its name (names are per
// set). unnamed_number reads n back from a full name; nullopt for any other name (a user's name
// that merely contains ".noname." included).
std::string unnamed_name(OpKind kind, uint64_t n);
std::string process_set_suffix(int set);
std::optional<uint64_t> unnamed_number(std::string_view name, OpKind kind, int set);

// How many threads of this process wait in Request::wait() or wait_quietly() now, on any request.
int threads_waiting();

// What one rank submitted, as the other ranks see it. Which fields count depends on the kind:
// count is this rank's elements (allreduce, broadcast, allgatherv) or the sum of counts
// (alltoall: the elements sent to each rank; reducescatter: each rank's block).
struct Descriptor {
  OpKind kind = OpKind::kAllreduce;
  DataType type = DataType::kUint8;
  ReduceOp op = ReduceOp::kSum;
  int32_t root = 0;
  int32_t device = -1;      // -1: host memory
  int32_t process_set = 0;  // 0: every rank
  double prescale = 1.0;
  double postscale = 1.0;
  uint64_t count = 0;
  std::vector<uint64_t> counts;
  // The tensor's full shape, when the caller gave it (perseus_next_shape); negotiation checks it
  // against the other ranks': whole for allreduce, broadcast and reducescatter, all but the
  // first dimension for allgatherv and alltoall.
  bool has_shape = false;
  std::vector<int64_t> shape;
  std::string name;

  bool operator==(const Descriptor &) const = default;
};

// A submitted operation inside this process, shared by the caller's handle and the engine.
struct Request {
  Descriptor what;
  const void *send = nullptr;
  void *recv = nullptr;
  void *stream = nullptr;
  std::chrono::steady_clock::time_point submitted;

  // Results that the library holds (allgatherv, alltoall) and join's last rank; written by the
  // engine before completion, read by the caller after it.
  std::vector<uint8_t> output;
  std::vector<size_t> output_counts;
  // Device memory: the event recorded on the caller's stream at submission, and a result the
  // library holds in device memory (allgatherv, alltoall) with its size in bytes.
  std::shared_ptr<void> ready_event;
  std::shared_ptr<void> device_output;
  size_t device_output_bytes = 0;
  int last_rank = -1;    // join: the last rank to join
  int created_set = -1;  // add_process_set: the new set's number

  // Completion. Once done, code and message never change.
  void succeed();
  void fail(Code code, const std::string &message);
  bool done() const;
  // Blocks until done; then throws Error(code, message) if it failed.
  void wait() const;
  // Blocks until done, ignoring the result (before the request's memory is freed).
  void wait_quietly() const noexcept;
  // Whether a thread is blocked in wait() or wait_quietly() now (for deadlock detection).
  bool waited_on() const { return waiters_.load(std::memory_order_acquire) > 0; }

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable done_changed_;
  bool done_ = false;
  std::atomic<bool> finished_{false};  // done_, readable without the lock
  mutable std::atomic<int> waiters_{0};
  Code code_ = Code::kInternal;
  std::string message_;
};

}  // namespace perseus::comm

#pragma once
// An all-reduce among the ranks of one host through one POSIX shared-memory segment, instead of
// Gloo's TCP loopback: every byte crosses memory twice (into the segment, back out) and each
// rank reduces its 1/P share of the buffer, so it runs at memory speed, not at socket speed.
//
// The segment: local rank 0 creates it (shm_open O_CREAT|O_EXCL, mode 0600), sizes it with
// posix_fallocate (a /dev/shm too small fails here, by name, rather than with SIGBUS later) and
// maps it; the others open it (retrying until the timeout) and map it; as soon as every rank
// has mapped it, rank 0 unlinks the name, so nothing is left in /dev/shm after a crash. The
// name must be unique to the job and hard to guess (the caller derives it from the job and a
// random token): a segment of that name that already exists is an error, not a peer.
//
// One call: the buffer is reduced in rounds of at most `slot_bytes`. Each rank copies its round
// into its slot in the segment, a barrier; rank r reduces block r (its 1/P of the round, split
// at cache lines) over every rank's slot with reduce_function (kAverage: the sum, then
// divide_elements by local_size); a barrier; every rank copies every block's result back. A
// block's place in a slot is fixed, and a rank's result goes into its own block of its own
// slot, which no rank writes in the copy-in: two barriers per round, none after the last.
// A small call (32 KiB a rank, 256 KiB over the ranks) takes one barrier instead: each rank
// copies its input into its place in one of two areas used in turn, a barrier, and every rank
// combines all the places itself, in rank order, so that every rank gets the same bits. The
// engine's negotiation messages (allgather) go the same way.
//
// Barriers poll briefly (sched_yield), then sleep on a shared futex (ranks may outnumber cores). A
// sleeper wakes every 100 ms to check that every peer's pid is still alive (a zombie counts as
// ended); a dead peer is Error(kCommunication) naming its local rank and pid, a wait longer than
// `timeout` is Error(kTimeout) naming the ranks that had not arrived. After a failure the
// object is unusable (every call throws) and the other ranks' waits end at once with an error
// that names this rank. Destroying it tells the peers too: a peer still waiting in a barrier
// (a call this rank never made) fails instead of hanging.
//
// Threads: one call at a time (the engine's thread). Every local rank must make the same calls,
// with the same count, type and op, in the same order. Peers are processes in the same pid
// namespace (their pids are checked with kill(pid, 0) and /proc).

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lib/comm/error.h"
#include "lib/comm/reduction.h"
#include "lib/comm/types.h"

namespace perseus::comm::shm {

struct SegmentHeader;  // local_allreduce.cc

class LocalAllreduce {
 public:
  // Bytes of the buffer one round reduces (each rank's slot). The segment holds local_size
  // slots; /dev/shm must have room for them (docker's default is 64 MB).
  static constexpr size_t kDefaultSlotBytes = size_t{4} << 20;
  // The most bytes a rank gives to a small call (one barrier; see the top of this file), and
  // the most allgatherv takes from each rank.
  static constexpr size_t kSmallBytes = size_t{32} << 10;

  // segment_name: "/" then 16 to 200 of [A-Za-z0-9._-]. peer_pids[r]: local rank r's pid (this
  // rank's own entry is not used). Throws Error(kInvalidArgument) for a bad argument,
  // kCommunication when the segment cannot be created, opened or mapped or a peer ends first,
  // kTimeout when the peers have not all mapped it within `timeout`. local_size 1 makes no
  // segment.
  LocalAllreduce(const std::string &segment_name, int local_rank, int local_size,
                 std::vector<pid_t> peer_pids, std::chrono::milliseconds timeout,
                 size_t slot_bytes = kDefaultSlotBytes);
  ~LocalAllreduce();
  LocalAllreduce(const LocalAllreduce &) = delete;
  LocalAllreduce &operator=(const LocalAllreduce &) = delete;

  // In place, blocking: buffer[i] = op over every local rank's buffer[i]. Throws as above.
  void allreduce(void *buffer, size_t count, DataType type, ReduceOp op);
  // The same out of place: send is only read, recv (which must not overlap send unless equal
  // to it) gets the result.
  void allreduce(const void *send, void *recv, size_t count, DataType type, ReduceOp op);
  // A reduce-scatter: recv (`length` elements, not overlapping send) = elements
  // [first, first + length) of the all-reduce of send's `count`. The reduction is shared as in
  // allreduce; only the copy out is this rank's part alone. Every local rank passes the same
  // count; first and length are its own.
  void reducescatter(const void *send, size_t count, size_t first, size_t length, void *recv,
                     DataType type, ReduceOp op);
  // Blocking: out (local_size * bytes) = every local rank's `bytes` of `mine`, in local-rank
  // order (the engine's negotiation messages). bytes must not exceed block_bytes().
  void allgather(const void *mine, size_t bytes, void *out);
  size_t block_bytes() const { return block_bytes_; }
  // Blocking: out = every local rank's bytes[r] bytes, one after the other in local-rank order
  // (this rank gives bytes[local rank] of `mine`). Every rank passes the same `bytes`, none over
  // kSmallBytes. One barrier.
  void allgatherv(const void *mine, void *out, const std::vector<size_t> &bytes);

 private:
  struct Split;

  void create();
  void open();
  void map(int fd, const char *how);
  void wait_until_all_mapped();
  void release() noexcept;

  // allreduce and reducescatter: recv = elements [first, first + length) of the result.
  void reduce_window(const void *send, size_t count, DataType type, ReduceOp op, size_t first,
                     size_t length, void *recv);
  void reduce_round(const uint8_t *data, const Split &split, ReduceFunction reduce, DataType type,
                    ReduceOp op);
  uint8_t *block(int slot, int block) const;
  uint8_t *small_area();
  void barrier();
  void wait_for_generation(uint32_t seen);
  void check_peers_and_abort(std::chrono::steady_clock::time_point deadline, const char *during);
  std::string timeout_message(const char *during) const;
  [[noreturn]] void fail(Code code, const std::string &message);
  void publish_abort(Code code, const std::string &message) noexcept;

  const std::string name_;
  const int rank_;
  const int size_;
  const std::vector<pid_t> pids_;
  const std::chrono::milliseconds timeout_;
  size_t block_bytes_ = 0;  // one block's place in a slot; a slot is size_ blocks
  size_t mapped_bytes_ = 0;
  uint8_t *base_ = nullptr;
  SegmentHeader *header_ = nullptr;
  uint8_t *slots_ = nullptr;
  uint8_t *small_ = nullptr;  // after the slots: the small calls' two areas
  uint64_t small_calls_ = 0;  // small calls made: which area is next
  bool created_ = false;      // rank 0, once it owns the name
  bool unlinked_ = false;
  std::string broken_;  // why an earlier call failed; "" while usable
  std::chrono::steady_clock::time_point last_peer_check_;
};

}  // namespace perseus::comm::shm

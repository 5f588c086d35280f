#pragma once
// One NCCL communicator among the job's ranks, one GPU per rank: the layer the engine calls to
// run collectives on device memory. It initialises NCCL without blocking (config.blocking = 0)
// and polls, so every wait is bounded: a rank that never joins, or an operation whose peers
// never come, ends in Error(kTimeout) instead of a hang.
//
// Promises: each operation is queued on the given CUDA stream and returns at once; its output is
// final when that stream's work up to here is done (record an event after the call and wait on
// it). Every rank must queue the same operations in the same order with the same counts, type,
// op and root (the engine's negotiation ensures it); nothing here checks that the buffers are
// device memory of `device()` (check_device_pointer does, at the engine's submission). count 0
// queues nothing. The operations change the calling thread's current device only for their
// length.
//
// Failures: Error(kInvalidArgument) for arguments this class can check (counts per rank) and for
// NCCL's "invalid argument/usage" while the communicator is still sound; Error(kTimeout) when
// joining or a queued call's set-up outlasts its limit; Error(kCommunication) for anything else:
// a lost peer, a network or CUDA failure, found when a call returns or by check_async_error().
// Those last two abort the communicator first (ncclCommAbort), so every later call fails at once
// with the same cause: the job cannot go on; report the message and exit non-zero.
//
// Threads: one thread at a time (the engine's background thread); not thread-safe.

#include <chrono>
#include <cstddef>
#include <functional>
#include <span>
#include <string>

#include "lib/comm/error.h"
#include "lib/comm/nccl/cuda_api.h"
#include "lib/comm/nccl/nccl_api.h"
#include "lib/comm/types.h"

namespace perseus::comm::nccl {

// Hands rank 0's NCCL unique id to every rank. Rank 0 calls it with its id (kNcclUniqueIdBytes
// bytes) and gets it back; every other rank calls it with "" and gets rank 0's id. The engine
// implements it over the job's rendezvous store, within the same deadline, and throws
// Error(kTimeout) or Error(kRendezvous) when it cannot.
using IdExchange = std::function<std::string(const std::string &mine_if_rank0)>;

class Communicator {
 public:
  using Clock = std::chrono::steady_clock;

  // Joins the communicator of `size` ranks as `rank` on CUDA device `device`, with the process's
  // CUDA runtime and NCCL (cuda_api(), nccl_api(): their load errors pass through). Returns when
  // every rank has joined. Throws Error(kTimeout) "rank R did not join the NCCL communicator
  // within S s ..." at `deadline`, Error(kInvalidArgument) for a rank, size or device out of
  // range, Error(kCommunication) when NCCL fails.
  Communicator(int rank, int size, int device, const IdExchange &exchange,
               Clock::time_point deadline);
  // The same with given tables, which must outlive the communicator (tests pass fakes).
  Communicator(const CudaApi &cuda, const NcclApi &nccl, int rank, int size, int device,
               const IdExchange &exchange, Clock::time_point deadline);
  // finalize(kDestroyTimeout) when sound; ncclCommAbort when failed or that does not succeed.
  ~Communicator();
  Communicator(const Communicator &) = delete;
  Communicator &operator=(const Communicator &) = delete;

  static constexpr std::chrono::seconds kDestroyTimeout{10};

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }

  // How long a call may stay "in progress" in NCCL (the first operation toward a peer connects
  // to it, which needs that peer) before Error(kTimeout). Default: 30 min, as the collective
  // timeout's default.
  void set_progress_timeout(std::chrono::milliseconds timeout) { progress_timeout_ = timeout; }

  // recv = op over ranks of send (count elements each); send == recv is in place. kAverage is
  // ncclAvg: the sum divided by size, with C's integer division for integer types.
  void allreduce(const void *send, void *recv, size_t count, DataType type, ReduceOp op,
                 CudaStream stream);
  // recv on `root` = op over ranks of send (recv is not written elsewhere; send == recv is in
  // place).
  void reduce(const void *send, void *recv, size_t count, DataType type, ReduceOp op, int root,
              CudaStream stream);
  // recv on every rank = send of `root` (send is read on root only; send == recv is in place).
  void broadcast(const void *send, void *recv, size_t count, DataType type, int root,
                 CudaStream stream);
  // recv (count * size elements) = every rank's send in rank order; send may be
  // recv + rank * count (in place).
  void allgather(const void *send, void *recv, size_t count, DataType type, CudaStream stream);
  // recv = every rank's send (counts[r] elements from rank r, counts the same on every rank),
  // in rank order with no gaps. Equal counts are one ncclAllGather; otherwise one
  // ncclBroadcast per rank with a non-zero count, in one group.
  void allgatherv(const void *send, void *recv, std::span<const size_t> counts, DataType type,
                  CudaStream stream);
  // send holds size blocks of recv_count elements; recv (recv_count elements) = op over ranks
  // of their block number rank(). Unequal blocks: the engine pads them to the largest.
  void reducescatter(const void *send, void *recv, size_t recv_count, DataType type, ReduceOp op,
                     CudaStream stream);
  // send holds send_counts[r] elements for rank r, one block after the other; recv receives
  // recv_counts[r] elements from rank r, in rank order. recv_counts[r] on this rank must equal
  // send_counts[rank()] on rank r. One group of ncclSend/ncclRecv; the block to itself is a
  // cudaMemcpyAsync. send and recv must not overlap.
  void alltoallv(const void *send, std::span<const size_t> send_counts, void *recv,
                 std::span<const size_t> recv_counts, DataType type, CudaStream stream);

  // Throws (and aborts) when NCCL has recorded an asynchronous error on this communicator (a
  // peer lost while a collective ran, a network failure), naming the cause; else returns. Cheap
  // (a flag read): the engine calls it while it waits for an operation's event.
  void check_async_error();
  // Aborts queued and running operations and frees the communicator. Idempotent; never throws.
  void abort() noexcept;
  // Waits (at most `timeout`) for the queued operations and frees the communicator. Throws
  // (after aborting) when NCCL fails or the time runs out.
  void finalize(std::chrono::milliseconds timeout);

 private:
  std::string who() const;  // "NCCL rank 1 of 4 (CUDA device 1)"
  NcclComm live_comm(const char *operation) const;
  // Turns a call's result into success (waiting while it is in progress) or an Error.
  void settle(NcclResult result, const std::string &doing);
  // Polls until NCCL's state for comm_ is no longer in progress or `deadline` passes.
  NcclResult wait_while_in_progress(Clock::time_point deadline);
  [[noreturn]] void fail(Code code, const std::string &message);
  void init(const IdExchange &exchange, Clock::time_point deadline);

  const CudaApi &cuda_;
  const NcclApi &nccl_;
  int rank_;
  int size_;
  int device_;
  NcclComm comm_ = nullptr;
  std::string failure_;  // why the communicator was aborted; "" while sound
  std::chrono::milliseconds progress_timeout_ = std::chrono::minutes(30);
};

}  // namespace perseus::comm::nccl

#pragma once
// The engine's side of host memory, beside nccl::DeviceExecutor for device memory: runs agreed
// operations on host buffers among the members of a process set (set 0 is every rank) through
// that set's transport::Backend (Gloo; solo::Backend for a set of one), through shared memory
// (shm::LocalAllreduce) for set 0's reductions when every rank is on this host, and packs
// fused all-reduces into one fusion buffer that it owns.
//
// Promises: every call blocks until this rank's output is final. Calls come from the engine's
// thread only, and every member of a set makes the same calls in the same order with the same
// counts (the negotiation agreed them). Buffers of empty outputs may be null.
// Failures: the backends' (Error(kCommunication) or kTimeout); after one the executor must be
// closed (close()) and the job ends.

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "lib/comm/transport/backend.h"
#include "lib/comm/types.h"

namespace perseus::comm {

namespace shm {
class LocalAllreduce;
}

class HostExecutor {
 public:
  using Clock = std::chrono::steady_clock;
  // Connects the members of a new process set among themselves (collective among them).
  using ConnectSet =
      std::function<std::unique_ptr<transport::Backend>(int set, int rank_in_set, int set_size)>;

  // world: every rank's backend; local: shared memory when every rank is on this host (else
  // null).
  HostExecutor(int rank, std::unique_ptr<transport::Backend> world,
               std::unique_ptr<shm::LocalAllreduce> local, ConnectSet connect_set);
  ~HostExecutor();
  HostExecutor(const HostExecutor &) = delete;
  HostExecutor &operator=(const HostExecutor &) = delete;

  // Process set `set` is made of `ranks` (in rank order): a member connects to the others. A
  // rank outside it calls nothing of the set's.
  void add_set(int set, const std::vector<int> &ranks);
  // Closes every connection and the shared memory, so that peers waiting on this rank fail
  // instead of waiting for it (after a failure).
  void close();
  // At the job's orderly end: closes the process sets' connections and the shared memory; the
  // job's connection stays until the executor is destroyed (a peer may still be reading this
  // rank's last message).
  void finish();

  // The engine's own exchange among every rank: out = each rank's `bytes` of `mine` in rank
  // order, through shared memory when there (sizes that differ by rank: allgatherv of set 0).
  void allgather(const void *mine, size_t bytes, void *out);

  // One tensor of a fused all-reduce; send == nullptr stands for zeros (a joined rank, which
  // gets no result: recv is null too).
  struct Piece {
    const void *send;
    void *recv;
    size_t count;
  };
  struct Scaling {
    double prescale = 1.0;
    double postscale = 1.0;
  };
  // When the pieces were packed (== the call's start when not fused) and reduced, and by what
  // (the timeline's names).
  struct AllreduceTimes {
    Clock::time_point packed;
    Clock::time_point reduced;
    bool fused = false;
    const char *by = "";  // "SHM_ALLREDUCE", "GLOO_ALLREDUCE"
  };
  // recv = op over the set's members of send, for each piece; one piece with buffers is
  // reduced where it lies, more are packed into the fusion buffer.
  AllreduceTimes allreduce(int set, const std::vector<Piece> &pieces, DataType type, ReduceOp op,
                           Scaling scaling);
  // bytes from the member at `root` (its index in the set) to all; buffer may be null on a
  // member that joined.
  void broadcast(int set, void *buffer, size_t bytes, int root);
  // out = every member's bytes in rank order (bytes[i] from member i).
  void allgatherv(int set, const void *send, void *out, const std::vector<size_t> &bytes);
  // send_bytes[i] to member i, recv_bytes[i] from it.
  void alltoallv(int set, const void *send, const std::vector<size_t> &send_bytes, void *recv,
                 const std::vector<size_t> &recv_bytes);
  // send: counts[0] + ... elements, one block per member; recv = block `me` (this rank's index
  // in the set) reduced over the members: a true reduce-scatter (transport/backend.h), or
  // through shared memory for set 0 on one host.
  void reducescatter(int set, const void *send, void *recv, const std::vector<size_t> &counts,
                     int me, DataType type, ReduceOp op, Scaling scaling);

 private:
  transport::Backend &backend(int set);
  // Reduces count elements of buffer in place among the set's members.
  void reduce_in_place(int set, void *buffer, size_t count, DataType type, ReduceOp op);
  uint8_t *fusion(size_t bytes);

  const int rank_;
  std::unique_ptr<transport::Backend> world_;
  std::unique_ptr<shm::LocalAllreduce> local_;
  ConnectSet connect_set_;
  std::map<int, std::unique_ptr<transport::Backend>> sets_;  // the sets this rank is in, but 0
  std::vector<uint8_t> fusion_;
};

}  // namespace perseus::comm

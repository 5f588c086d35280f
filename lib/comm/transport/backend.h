#pragma once
// The contract of a host-memory communication backend (Gloo; solo for a job of one): blocking
// collectives among the ranks of one group (the job's, or a process set's), on host memory.
// Device memory has its own executor (nccl/device_executor.h).
//
// Promises: each call returns when this rank's part is done and its output is final. Calls are
// made from one thread (the engine's), and every rank makes the same calls in the same order
// with the same count, type, op and root (the negotiation made sure of it); the runtime has
// checked the arguments (valid type, op and root; non-null buffers; count > 0).
// Failures: Error(kCommunication) when a peer is lost or a transfer fails, Error(kTimeout) when
// a peer did not take part in time; the caller (c_api.cc) adds which call failed. After either, the
// backend is unusable: the job must end (perseusrun's fail-fast does the rest).

#include <cstddef>
#include <vector>

#include "lib/comm/types.h"

namespace perseus::comm::transport {

class Backend {
 public:
  virtual ~Backend() = default;

  // recv = op over all ranks of send; send == recv is in place, else they do not overlap.
  virtual void allreduce(const void *send, void *recv, size_t count, DataType type,
                         ReduceOp op) = 0;
  virtual void broadcast(void *buffer, size_t count, DataType type, int root) = 0;
  // recv holds count * size elements. send is either recv + rank * count (already in place) or
  // a buffer that does not overlap recv.
  virtual void allgather(const void *send, void *recv, size_t count, DataType type) = 0;
  virtual void barrier() = 0;
  // recv = every rank's bytes in rank order, counts[r] bytes from rank r; send (counts[rank]
  // bytes) does not overlap recv.
  virtual void allgatherv(const void *send, void *recv, const std::vector<size_t> &counts) = 0;
  // send holds send_counts[r] bytes for rank r, one block after the other; recv gets
  // recv_counts[r] bytes from rank r, in rank order. The two do not overlap.
  virtual void alltoallv(const void *send, const std::vector<size_t> &send_counts, void *recv,
                         const std::vector<size_t> &recv_counts) = 0;
  // send holds counts[0] + ... + counts[size - 1] elements, block r after block r - 1; recv
  // (counts[rank] elements, not overlapping send) = op over all ranks of block `rank`. Each
  // rank sends and receives about (size - 1) / size of the input, half of what an all-reduce
  // of it moves. Blocks may be empty.
  virtual void reducescatter(const void *send, void *recv, const std::vector<size_t> &counts,
                             DataType type, ReduceOp op) = 0;
};

}  // namespace perseus::comm::transport

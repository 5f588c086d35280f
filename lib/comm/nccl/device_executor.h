#pragma once
// The engine's side of device memory: runs agreed operations on CUDA buffers through one NCCL
// communicator, on Perseus's own stream, ordered after the work the caller had queued on its
// stream when it submitted (an event recorded then, waited for by our stream: no device-wide
// synchronisation), with a fusion buffer in device memory for packed all-reduces.
//
// All-reduces are spread round-robin over `lanes` streams, each with its own communicators
// (PERSEUS_ALLREDUCE_STREAMS), and go hierarchically (hierarchy.h) when the layout says so; they
// return once queued: the engine takes a Marker after a cycle's all-reduces and completes their
// requests once the marker is done(), polling it between cycles, so that the next cycle's
// negotiation and queueing overlap the GPU's work. Every other call returns when its output is
// final. Either way a request is done only when its result can be read on any stream.
//
// Made lazily by the engine at the first agreed device operation, which every rank reaches at
// the same point; used from the engine's thread only.

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "lib/comm/nccl/communicator.h"
#include "lib/comm/nccl/cuda_api.h"
#include "lib/comm/nccl/hierarchy.h"
#include "lib/comm/types.h"

namespace perseus::comm::nccl {

// An event recorded on `stream` of `device` now (the caller's thread, at submission); destroyed
// with the last copy. The caller's current device is left as it was.
std::shared_ptr<void> record_ready_event(int device, CudaStream stream);

// Device memory that frees itself.
std::shared_ptr<void> allocate_device(int device, size_t bytes);

// A synchronous device-to-anywhere copy (perseus_output_copy of a device result).
void copy_from_device(int device, void *dst, const void *src, size_t bytes);

class DeviceExecutor {
 public:
  // exchange(which, mine): IdExchange for each communicator, `which` naming it: "<lane>" for a
  // lane's communicator of every rank, "<lane>/host/<host index>" for its host's and
  // "<lane>/cross/<local rank>" for its cross-host one (hierarchical all-reduce only).
  using NamedIdExchange =
      std::function<std::string(const std::string &which, const std::string &mine_if_rank0)>;
  DeviceExecutor(int rank, int size, int device, int lanes, const HostLayout &layout,
                 const NamedIdExchange &exchange, Communicator::Clock::time_point deadline);
  ~DeviceExecutor();
  DeviceExecutor(const DeviceExecutor &) = delete;
  DeviceExecutor &operator=(const DeviceExecutor &) = delete;

  int device() const { return device_; }
  const HostLayout &layout() const { return layout_; }

  // One all-reduce of many tensors: send == nullptr stands for zeros (a joined rank). One piece
  // with send and recv is reduced where it lies; more are packed into the fusion buffer.
  struct Piece {
    const void *send;
    void *recv;
    size_t count;
    void *ready;  // the submission's event, or null
  };
  // Queued on the next lane; final once a later mark()'s marker is done.
  void allreduce(const std::vector<Piece> &pieces, DataType type, ReduceOp op);
  // The point every lane's stream has reached now: an event per lane with work queued since the
  // last mark. Give it to done() or wait() until true.
  struct Marker {
    std::vector<CudaEvent> events;
  };
  Marker mark();
  // Whether the work before `marker` is done (then its events go back to the process's pool;
  // call it no more for this marker). Raises NCCL's asynchronous errors, which abort the
  // communicators.
  bool done(Marker &marker);
  // Polls done() until true.
  void wait(Marker &marker);
  // buffer == nullptr: this rank joined and receives into scratch memory.
  void broadcast(void *buffer, size_t count, DataType type, int root, void *ready);
  // out: device memory of the sum of counts; filled in rank order.
  void allgatherv(const void *send, const std::vector<size_t> &counts, DataType type, void *out,
                  void *ready);
  void alltoallv(const void *send, const std::vector<size_t> &send_counts, void *out,
                 const std::vector<size_t> &recv_counts, DataType type, void *ready);
  // recv (recv_counts[rank] elements) = op over ranks of each one's block number `rank`.
  void reducescatter(const void *send, void *recv, const std::vector<size_t> &recv_counts,
                     DataType type, ReduceOp op, void *ready);

 private:
  // One stream with its communicator, completion event and fusion buffer.
  struct Lane {
    std::unique_ptr<Communicator> communicator;
    std::unique_ptr<Communicator> host;   // this host's ranks (hierarchical only)
    std::unique_ptr<Communicator> cross;  // across hosts (hierarchical, layout_.in_cross)
    CudaStream stream = nullptr;
    CudaEvent done = nullptr;
    std::shared_ptr<void> fusion;
    size_t fusion_bytes = 0;
    bool queued = false;  // work recorded since the last wait
  };
  void wait_for(Lane &lane, void *ready);
  void check_async_errors(Lane &lane);  // of each of the lane's communicators
  // One all-reduce on the lane's stream, hierarchical when layout_ says so.
  void reduce_all(Lane &lane, const void *send, void *recv, size_t count, DataType type,
                  ReduceOp op);
  void finish(Lane &lane);  // waits until the lane's work is done; raises NCCL's async errors
  void *scratch(Lane &lane, size_t bytes);

  const CudaApi &cuda_;
  int device_;
  HostLayout layout_;
  std::vector<Lane> lanes_;
  size_t next_lane_ = 0;
};

}  // namespace perseus::comm::nccl

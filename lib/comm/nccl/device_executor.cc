#include "lib/comm/nccl/device_executor.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "lib/comm/error.h"

namespace perseus::comm::nccl {

namespace {

// CUDA events are reused rather than made and destroyed per operation (two CUDA calls of a
// microsecond or so each): the submissions' events and the executors' markers. A submission's
// event goes back when its request lets go of it; by then the engine has queued its stream's
// wait for it, which took the event's state at that time, so recording it again is safe. Kept
// for the life of the process (never destroyed: a request may be released during exit).
class EventPool {
 public:
  static EventPool &instance() {
    static auto *pool = new EventPool;
    return *pool;
  }
  // An event of the current device, `device`.
  CudaEvent take(const CudaApi &cuda, int device) {
    {
      std::lock_guard lock(mutex_);
      auto &free = free_[device];
      if (!free.empty()) {
        CudaEvent event = free.back();
        free.pop_back();
        return event;
      }
    }
    CudaEvent event = nullptr;
    cuda.check(cuda.event_create_with_flags(&event, kCudaEventDisableTiming),
               "cudaEventCreateWithFlags");
    return event;
  }
  void give_back(int device, CudaEvent event) {
    std::lock_guard lock(mutex_);
    free_[device].push_back(event);
  }

 private:
  std::mutex mutex_;
  std::map<int, std::vector<CudaEvent>> free_;
};

}  // namespace

std::shared_ptr<void> record_ready_event(int device, CudaStream stream) {
  const CudaApi &cuda = cuda_api();
  ScopedDevice on(cuda, device);
  CudaEvent event = EventPool::instance().take(cuda, device);
  std::shared_ptr<void> owned(event,
                              [device](void *e) { EventPool::instance().give_back(device, e); });
  cuda.check(cuda.event_record(event, stream),
             "cudaEventRecord on the caller's stream (is it a stream of CUDA device " +
                 std::to_string(device) + "?)");
  return owned;
}

std::shared_ptr<void> allocate_device(int device, size_t bytes) {
  const CudaApi &cuda = cuda_api();
  ScopedDevice on(cuda, device);
  void *pointer = nullptr;
  cuda.check(
      cuda.malloc(&pointer, std::max<size_t>(bytes, 1)),
      "cudaMalloc of " + std::to_string(bytes) + " bytes on CUDA device " + std::to_string(device));
  return std::shared_ptr<void>(pointer, [&cuda, device](void *p) {
    const int saved = [&] {
      int d = 0;
      cuda.get_device(&d);
      return d;
    }();
    cuda.set_device(device);
    cuda.free(p);
    cuda.set_device(saved);
  });
}

void copy_from_device(int device, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return;
  const CudaApi &cuda = cuda_api();
  ScopedDevice on(cuda, device);
  cuda.check(cuda.memcpy_async(dst, src, bytes, kCudaMemcpyDefault, nullptr),
             "copying a result of " + std::to_string(bytes) + " bytes");
  cuda.check(cuda.stream_synchronize(nullptr), "waiting for the copy of a result");
}

DeviceExecutor::DeviceExecutor(int rank, int size, int device, int lanes, const HostLayout &layout,
                               const NamedIdExchange &exchange,
                               Communicator::Clock::time_point deadline)
    : cuda_(cuda_api()),
      device_(device),
      layout_(layout),
      lanes_(static_cast<size_t>(std::max(lanes, 1))) {
  // NVLink multicast (NVLS) stays off unless the user turns it on: the lent GPU machines must
  // not use it, and NCCL reads the variable when the communicator is made.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  const auto join = [&](const std::string &which, int member, int members) {
    return std::make_unique<Communicator>(
        member, members, device,
        [&exchange, which](const std::string &mine) { return exchange(which, mine); }, deadline);
  };
  for (size_t i = 0; i < lanes_.size(); ++i) {
    Lane &lane = lanes_[i];
    const std::string name = std::to_string(i);
    lane.communicator = join(name, rank, size);
    if (layout_.scheme != Scheme::kFlat) {
      lane.host = join(name + "/host/" + std::to_string(layout_.host_index), layout_.local_rank,
                       layout_.local_size);
      if (layout_.in_cross) {
        lane.cross = join(name + "/cross/" + std::to_string(layout_.local_rank), layout_.cross_rank,
                          layout_.cross_size);
      }
    }
    ScopedDevice on(cuda_, device_);
    cuda_.check(cuda_.stream_create_with_flags(&lane.stream, kCudaStreamNonBlocking),
                "creating Perseus's CUDA stream");
    cuda_.check(cuda_.event_create_with_flags(&lane.done, kCudaEventDisableTiming),
                "creating Perseus's CUDA event");
  }
}

DeviceExecutor::~DeviceExecutor() {
  const int saved = [&] {
    int d = 0;
    cuda_.get_device(&d);
    return d;
  }();
  for (Lane &lane : lanes_) {
    lane.fusion.reset();
    lane.cross.reset();
    lane.host.reset();
    lane.communicator.reset();
    cuda_.set_device(device_);
    if (lane.done) cuda_.event_destroy(lane.done);
    if (lane.stream) cuda_.stream_destroy(lane.stream);
  }
  cuda_.set_device(saved);
}

void DeviceExecutor::wait_for(Lane &lane, void *ready) {
  if (ready) {
    cuda_.check(cuda_.stream_wait_event(lane.stream, ready, 0),
                "ordering Perseus's stream after the caller's");
  }
}

void DeviceExecutor::finish(Lane &lane) {
  cuda_.check(cuda_.event_record(lane.done, lane.stream), "cudaEventRecord on Perseus's stream");
  // Polls rather than blocks, so that an NCCL failure (a peer lost) is seen while waiting.
  for (;;) {
    const CudaError state = cuda_.event_query(lane.done);
    if (state == kCudaSuccess) break;
    if (state != kCudaErrorNotReady) cuda_.check(state, "waiting for Perseus's stream");
    check_async_errors(lane);
    std::this_thread::yield();
  }
  check_async_errors(lane);
  lane.queued = false;
}

void DeviceExecutor::check_async_errors(Lane &lane) {
  lane.communicator->check_async_error();
  if (lane.host) lane.host->check_async_error();
  if (lane.cross) lane.cross->check_async_error();
}

void DeviceExecutor::reduce_all(Lane &lane, const void *send, void *recv, size_t count,
                                DataType type, ReduceOp op) {
  hierarchical_allreduce(layout_, *lane.communicator, lane.host.get(), lane.cross.get(), send, recv,
                         count, type, op, lane.stream);
}

DeviceExecutor::Marker DeviceExecutor::mark() {
  ScopedDevice on(cuda_, device_);
  Marker marker;
  for (Lane &lane : lanes_) {
    if (!lane.queued) continue;
    CudaEvent event = EventPool::instance().take(cuda_, device_);
    marker.events.push_back(event);
    cuda_.check(cuda_.event_record(event, lane.stream), "cudaEventRecord on Perseus's stream");
    lane.queued = false;
  }
  return marker;
}

bool DeviceExecutor::done(Marker &marker) {
  while (!marker.events.empty()) {
    const CudaError state = cuda_.event_query(marker.events.back());
    if (state == kCudaErrorNotReady) {
      for (Lane &lane : lanes_) check_async_errors(lane);  // a peer lost while we wait
      return false;
    }
    cuda_.check(state, "waiting for Perseus's stream");
    EventPool::instance().give_back(device_, marker.events.back());
    marker.events.pop_back();
  }
  for (Lane &lane : lanes_) check_async_errors(lane);
  return true;
}

void DeviceExecutor::wait(Marker &marker) {
  while (!done(marker)) std::this_thread::yield();
}

void *DeviceExecutor::scratch(Lane &lane, size_t bytes) {
  if (bytes > lane.fusion_bytes) {
    lane.fusion.reset();
    lane.fusion = allocate_device(device_, bytes);
    lane.fusion_bytes = bytes;
  }
  return lane.fusion.get();
}

void DeviceExecutor::allreduce(const std::vector<Piece> &pieces, DataType type, ReduceOp op) {
  ScopedDevice on(cuda_, device_);
  Lane &lane = lanes_[next_lane_++ % lanes_.size()];
  const size_t unit = element_size(type);
  size_t total = 0;
  for (const Piece &p : pieces) {
    wait_for(lane, p.ready);
    total += p.count;
  }
  if (total == 0) return;
  lane.queued = true;
  if (pieces.size() == 1 && pieces[0].send) {
    reduce_all(lane, pieces[0].send, pieces[0].recv, total, type, op);
    return;
  }
  auto *buffer = static_cast<uint8_t *>(scratch(lane, total * unit));
  size_t offset = 0;
  for (const Piece &p : pieces) {
    const size_t bytes = p.count * unit;
    if (bytes == 0) continue;
    if (p.send) {
      cuda_.check(
          cuda_.memcpy_async(buffer + offset, p.send, bytes, kCudaMemcpyDefault, lane.stream),
          "copying into the fusion buffer");
    } else {
      cuda_.check(cuda_.memset_async(buffer + offset, 0, bytes, lane.stream),
                  "zeroing a joined rank's part of the fusion buffer");
    }
    offset += bytes;
  }
  reduce_all(lane, buffer, buffer, total, type, op);
  offset = 0;
  for (const Piece &p : pieces) {
    const size_t bytes = p.count * unit;
    if (bytes == 0) continue;
    if (p.recv) {
      cuda_.check(
          cuda_.memcpy_async(p.recv, buffer + offset, bytes, kCudaMemcpyDefault, lane.stream),
          "copying out of the fusion buffer");
    }
    offset += bytes;
  }
}

void DeviceExecutor::broadcast(void *buffer, size_t count, DataType type, int root, void *ready) {
  ScopedDevice on(cuda_, device_);
  Lane &lane = lanes_[0];
  wait_for(lane, ready);
  if (count == 0) return;
  if (!buffer) buffer = scratch(lane, count * element_size(type));
  lane.communicator->broadcast(buffer, buffer, count, type, root, lane.stream);
  finish(lane);
}

void DeviceExecutor::allgatherv(const void *send, const std::vector<size_t> &counts, DataType type,
                                void *out, void *ready) {
  ScopedDevice on(cuda_, device_);
  Lane &lane = lanes_[0];
  wait_for(lane, ready);
  if (std::accumulate(counts.begin(), counts.end(), size_t{0}) == 0) return;
  lane.communicator->allgatherv(send, out, counts, type, lane.stream);
  finish(lane);
}

void DeviceExecutor::alltoallv(const void *send, const std::vector<size_t> &send_counts, void *out,
                               const std::vector<size_t> &recv_counts, DataType type, void *ready) {
  ScopedDevice on(cuda_, device_);
  Lane &lane = lanes_[0];
  wait_for(lane, ready);
  lane.communicator->alltoallv(send, send_counts, out, recv_counts, type, lane.stream);
  finish(lane);
}

void DeviceExecutor::reducescatter(const void *send, void *recv,
                                   const std::vector<size_t> &recv_counts, DataType type,
                                   ReduceOp op, void *ready) {
  ScopedDevice on(cuda_, device_);
  Lane &lane = lanes_[0];
  wait_for(lane, ready);
  const size_t total = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0});
  if (total == 0) return;
  const auto rank = static_cast<size_t>(lane.communicator->rank());
  const bool even = std::all_of(recv_counts.begin(), recv_counts.end(),
                                [&](size_t c) { return c == recv_counts[0]; });
  if (even) {
    lane.communicator->reducescatter(send, recv, recv_counts[0], type, op, lane.stream);
  } else {
    // Uneven blocks: an all-reduce of the whole input, of which this rank keeps its block.
    const size_t unit = element_size(type);
    auto *buffer = static_cast<uint8_t *>(scratch(lane, total * unit));
    lane.communicator->allreduce(send, buffer, total, type, op, lane.stream);
    const size_t offset = std::accumulate(recv_counts.begin(),
                                          recv_counts.begin() + static_cast<long>(rank), size_t{0});
    if (recv_counts[rank]) {
      cuda_.check(cuda_.memcpy_async(recv, buffer + offset * unit, recv_counts[rank] * unit,
                                     kCudaMemcpyDefault, lane.stream),
                  "copying this rank's block");
    }
  }
  finish(lane);
}

}  // namespace perseus::comm::nccl

#include "lib/comm/nccl/device_executor.h"

#include <algorithm>
#include <numeric>
#include <thread>

#include "lib/comm/error.h"

namespace perseus::comm::nccl {

namespace {

// Makes `device` current for the length of a scope and restores the caller's device after.
class OnDevice {
 public:
  OnDevice(const CudaApi &cuda, int device) : cuda_(cuda) {
    cuda_.check(cuda_.get_device(&previous_), "cudaGetDevice");
    if (previous_ != device) cuda_.check(cuda_.set_device(device), "cudaSetDevice");
  }
  ~OnDevice() { cuda_.set_device(previous_); }
  OnDevice(const OnDevice &) = delete;
  OnDevice &operator=(const OnDevice &) = delete;

 private:
  const CudaApi &cuda_;
  int previous_ = 0;
};

}  // namespace

std::shared_ptr<void> record_ready_event(int device, CudaStream stream) {
  const CudaApi &cuda = cuda_api();
  OnDevice on(cuda, device);
  CudaEvent event = nullptr;
  cuda.check(cuda.event_create_with_flags(&event, kCudaEventDisableTiming),
             "cudaEventCreateWithFlags for the submission's event");
  std::shared_ptr<void> owned(event, [&cuda](void *e) { cuda.event_destroy(e); });
  cuda.check(cuda.event_record(event, stream),
             "cudaEventRecord on the caller's stream (is it a stream of CUDA device " +
                 std::to_string(device) + "?)");
  return owned;
}

std::shared_ptr<void> allocate_device(int device, size_t bytes) {
  const CudaApi &cuda = cuda_api();
  OnDevice on(cuda, device);
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
  OnDevice on(cuda, device);
  cuda.check(cuda.memcpy_async(dst, src, bytes, kCudaMemcpyDefault, nullptr),
             "copying a result of " + std::to_string(bytes) + " bytes");
  cuda.check(cuda.stream_synchronize(nullptr), "waiting for the copy of a result");
}

DeviceExecutor::DeviceExecutor(int rank, int size, int device, const IdExchange &exchange,
                               Communicator::Clock::time_point deadline)
    : cuda_(cuda_api()), device_(device) {
  communicator_ = std::make_unique<Communicator>(rank, size, device, exchange, deadline);
  OnDevice on(cuda_, device_);
  cuda_.check(cuda_.stream_create_with_flags(&stream_, kCudaStreamNonBlocking),
              "creating Perseus's CUDA stream");
  cuda_.check(cuda_.event_create_with_flags(&done_, kCudaEventDisableTiming),
              "creating Perseus's CUDA event");
}

DeviceExecutor::~DeviceExecutor() {
  fusion_.reset();
  communicator_.reset();
  const int saved = [&] {
    int d = 0;
    cuda_.get_device(&d);
    return d;
  }();
  cuda_.set_device(device_);
  if (done_) cuda_.event_destroy(done_);
  if (stream_) cuda_.stream_destroy(stream_);
  cuda_.set_device(saved);
}

void DeviceExecutor::wait_for(void *ready) {
  if (ready) {
    cuda_.check(cuda_.stream_wait_event(stream_, ready, 0),
                "ordering Perseus's stream after the caller's");
  }
}

void DeviceExecutor::finish() {
  cuda_.check(cuda_.event_record(done_, stream_), "cudaEventRecord on Perseus's stream");
  // Polls rather than blocks, so that an NCCL failure (a peer lost) is seen while waiting.
  for (;;) {
    const CudaError state = cuda_.event_query(done_);
    if (state == kCudaSuccess) break;
    if (state != kCudaErrorNotReady) cuda_.check(state, "waiting for Perseus's stream");
    communicator_->check_async_error();
    std::this_thread::yield();
  }
  communicator_->check_async_error();
}

void *DeviceExecutor::scratch(size_t bytes) {
  if (bytes > fusion_bytes_) {
    fusion_.reset();
    fusion_ = allocate_device(device_, bytes);
    fusion_bytes_ = bytes;
  }
  return fusion_.get();
}

void DeviceExecutor::allreduce(const std::vector<Piece> &pieces, DataType type, ReduceOp op) {
  OnDevice on(cuda_, device_);
  const size_t unit = element_size(type);
  size_t total = 0;
  for (const Piece &p : pieces) {
    wait_for(p.ready);
    total += p.count;
  }
  if (total == 0) return;
  if (pieces.size() == 1 && pieces[0].send) {
    communicator_->allreduce(pieces[0].send, pieces[0].recv, total, type, op, stream_);
    finish();
    return;
  }
  auto *buffer = static_cast<uint8_t *>(scratch(total * unit));
  size_t offset = 0;
  for (const Piece &p : pieces) {
    const size_t bytes = p.count * unit;
    if (p.send) {
      cuda_.check(cuda_.memcpy_async(buffer + offset, p.send, bytes, kCudaMemcpyDefault, stream_),
                  "copying into the fusion buffer");
    } else {
      cuda_.check(cuda_.memset_async(buffer + offset, 0, bytes, stream_),
                  "zeroing a joined rank's part of the fusion buffer");
    }
    offset += bytes;
  }
  communicator_->allreduce(buffer, buffer, total, type, op, stream_);
  offset = 0;
  for (const Piece &p : pieces) {
    const size_t bytes = p.count * unit;
    if (p.recv) {
      cuda_.check(cuda_.memcpy_async(p.recv, buffer + offset, bytes, kCudaMemcpyDefault, stream_),
                  "copying out of the fusion buffer");
    }
    offset += bytes;
  }
  finish();
}

void DeviceExecutor::broadcast(void *buffer, size_t count, DataType type, int root, void *ready) {
  OnDevice on(cuda_, device_);
  wait_for(ready);
  if (count == 0) return;
  if (!buffer) buffer = scratch(count * element_size(type));
  communicator_->broadcast(buffer, buffer, count, type, root, stream_);
  finish();
}

void DeviceExecutor::allgatherv(const void *send, const std::vector<size_t> &counts, DataType type,
                                void *out, void *ready) {
  OnDevice on(cuda_, device_);
  wait_for(ready);
  if (std::accumulate(counts.begin(), counts.end(), size_t{0}) == 0) return;
  communicator_->allgatherv(send, out, counts, type, stream_);
  finish();
}

void DeviceExecutor::alltoallv(const void *send, const std::vector<size_t> &send_counts, void *out,
                               const std::vector<size_t> &recv_counts, DataType type, void *ready) {
  OnDevice on(cuda_, device_);
  wait_for(ready);
  communicator_->alltoallv(send, send_counts, out, recv_counts, type, stream_);
  finish();
}

void DeviceExecutor::reducescatter(const void *send, void *recv,
                                   const std::vector<size_t> &recv_counts, DataType type,
                                   ReduceOp op, void *ready) {
  OnDevice on(cuda_, device_);
  wait_for(ready);
  const size_t total = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0});
  if (total == 0) return;
  const auto rank = static_cast<size_t>(communicator_->rank());
  const bool even = std::all_of(recv_counts.begin(), recv_counts.end(),
                                [&](size_t c) { return c == recv_counts[0]; });
  if (even) {
    communicator_->reducescatter(send, recv, recv_counts[0], type, op, stream_);
  } else {
    // Uneven blocks: an all-reduce of the whole input, of which this rank keeps its block.
    const size_t unit = element_size(type);
    auto *buffer = static_cast<uint8_t *>(scratch(total * unit));
    communicator_->allreduce(send, buffer, total, type, op, stream_);
    const size_t offset = std::accumulate(recv_counts.begin(),
                                          recv_counts.begin() + static_cast<long>(rank), size_t{0});
    if (recv_counts[rank]) {
      cuda_.check(cuda_.memcpy_async(recv, buffer + offset * unit, recv_counts[rank] * unit,
                                     kCudaMemcpyDefault, stream_),
                  "copying this rank's block");
    }
  }
  finish();
}

}  // namespace perseus::comm::nccl

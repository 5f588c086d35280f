#include "lib/comm/nccl/communicator.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "lib/comm/error.h"

namespace perseus::comm::nccl {

namespace {

using std::chrono::milliseconds;

NcclDataType to_nccl(DataType type) {
  switch (type) {
    case DataType::kUint8:
      return kNcclUint8;
    case DataType::kInt8:
      return kNcclInt8;
    case DataType::kInt32:
      return kNcclInt32;
    case DataType::kInt64:
      return kNcclInt64;
    case DataType::kFloat16:
      return kNcclFloat16;
    case DataType::kBfloat16:
      return kNcclBfloat16;
    case DataType::kFloat32:
      return kNcclFloat32;
    case DataType::kFloat64:
      return kNcclFloat64;
    case DataType::kInt16:
      break;
  }
  throw Error(Code::kInvalidArgument, std::string("NCCL has no type for ") + name_of(type) +
                                          " to reduce: reduce it in host memory, or as int32");
}

// The NCCL type that moves `type`'s elements bit for bit (broadcast, gather, send): int16
// travels as float16, of the same width, which NCCL only copies there.
NcclDataType moved_as(DataType type) {
  return type == DataType::kInt16 ? kNcclFloat16 : to_nccl(type);
}

NcclRedOp to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return kNcclSum;
    case ReduceOp::kAverage:
      return kNcclAvg;
    case ReduceOp::kMin:
      return kNcclMin;
    case ReduceOp::kMax:
      return kNcclMax;
    case ReduceOp::kProduct:
      return kNcclProd;
  }
  throw Error(Code::kInternal, "no NCCL op for op " + std::to_string(static_cast<int>(op)));
}

// What a failed NCCL result most likely means for the job, in front of NCCL's own text.
const char *cause_of(NcclResult result) {
  switch (result) {
    case kNcclRemoteError:
      return "a peer failed or was lost";
    case kNcclSystemError:
      return "a system call or the network failed (a peer may have died)";
    case kNcclUnhandledCudaError:
      return "a CUDA call failed inside NCCL";
    case kNcclInvalidArgument:
    case kNcclInvalidUsage:
      return "NCCL refused the call's arguments";
    default:
      return "NCCL failed";
  }
}

std::string describe_call(const char *operation, size_t count, DataType type) {
  return std::string(operation) + " of " + std::to_string(count) + " " + name_of(type);
}

// The address `elements` elements of `type` after `base`.
const void *at(const void *base, size_t elements, DataType type) {
  return static_cast<const char *>(base) + elements * element_size(type);
}
void *at(void *base, size_t elements, DataType type) {
  return static_cast<char *>(base) + elements * element_size(type);
}

// NCCL's op for `op` on a communicator of `size` ranks. On one rank an average is the input
// itself, and NCCL's one-rank path runs ncclAvg through its own scaling kernel, which was seen
// to leave the last elements of some sizes wrong (4913 float32, 65537 float64, 2^20+3 of any
// float type on an H200); ncclSum there is a plain copy.
NcclRedOp op_for(ReduceOp op, int size) {
  return size == 1 && op == ReduceOp::kAverage ? kNcclSum : to_nccl(op);
}

}  // namespace

Communicator::Communicator(int rank, int size, int device, const IdExchange &exchange,
                           Clock::time_point deadline)
    : Communicator(cuda_api(), nccl_api(), rank, size, device, exchange, deadline) {}

Communicator::Communicator(const CudaApi &cuda, const NcclApi &nccl, int rank, int size, int device,
                           const IdExchange &exchange, Clock::time_point deadline)
    : cuda_(cuda), nccl_(nccl), rank_(rank), size_(size), device_(device) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error(Code::kInvalidArgument, "NCCL communicator: rank " + std::to_string(rank) +
                                            " is not in 0.." + std::to_string(size - 1));
  }
  int devices = 0;
  cuda_.check(cuda_.get_device_count(&devices), who() + ": cudaGetDeviceCount");
  if (device < 0 || device >= devices) {
    throw Error(Code::kInvalidArgument, who() + ": this process sees " + std::to_string(devices) +
                                            " CUDA devices (0.." + std::to_string(devices - 1) +
                                            "; CUDA_VISIBLE_DEVICES decides which)");
  }
  init(exchange, deadline);
}

void Communicator::init(const IdExchange &exchange, Clock::time_point deadline) {
  const auto start = Clock::now();
  ScopedDevice current(cuda_, device_);
  std::string mine;
  if (rank_ == 0) {
    NcclUniqueId id{};
    const NcclResult result = nccl_.get_unique_id(&id);
    if (result != kNcclSuccess) {
      throw Error(Code::kCommunication,
                  who() + ": ncclGetUniqueId: " + nccl_.describe(result, nullptr));
    }
    mine.assign(id.internal, sizeof id.internal);
  }
  const std::string shared = exchange(mine);
  if (shared.size() != kNcclUniqueIdBytes) {
    throw Error(Code::kRendezvous, who() + ": the NCCL unique id from rank 0 has " +
                                       std::to_string(shared.size()) + " bytes, expected " +
                                       std::to_string(kNcclUniqueIdBytes));
  }
  NcclUniqueId id{};
  std::copy(shared.begin(), shared.end(), id.internal);
  NcclConfig config;
  config.blocking = 0;
  const NcclResult result = nccl_.comm_init_rank_config(&comm_, size_, id, rank_, &config);
  if (result != kNcclSuccess && result != kNcclInProgress) {
    const std::string text = nccl_.describe(result, comm_);
    if (comm_ != nullptr) abort();
    throw Error(Code::kCommunication, who() + ": ncclCommInitRankConfig: " + text);
  }
  const NcclResult state = wait_while_in_progress(deadline);
  if (state == kNcclInProgress) {
    const auto waited = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start);
    fail(Code::kTimeout,
         "rank " + std::to_string(rank_) + " did not join the NCCL communicator within " +
             std::to_string(waited.count()) + " s (" + std::to_string(size_) +
             " ranks, CUDA device " + std::to_string(device_) +
             "): another rank has not joined or has died; the limit is PERSEUS_INIT_TIMEOUT");
  }
  if (state != kNcclSuccess) {
    fail(Code::kCommunication, who() + " could not join the NCCL communicator: " + cause_of(state) +
                                   ": " + nccl_.describe(state, comm_));
  }
}

Communicator::~Communicator() {
  if (comm_ == nullptr) return;
  try {
    finalize(kDestroyTimeout);
  } catch (...) {
    abort();  // finalize has aborted already; this only makes sure
  }
}

std::string Communicator::who() const {
  return "NCCL rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " (CUDA device " +
         std::to_string(device_) + ")";
}

NcclComm Communicator::live_comm(const char *operation) const {
  if (comm_ != nullptr) return comm_;
  throw Error(Code::kCommunication, std::string(operation) + ": " + who() + " was aborted" +
                                        (failure_.empty() ? "" : " after: " + failure_) +
                                        "; the job cannot go on: exit with a non-zero code");
}

NcclResult Communicator::wait_while_in_progress(Clock::time_point deadline) {
  // NCCL's own threads do the work; polling its state costs an atomic read. Start fast (most
  // calls settle in microseconds), then back off to 1 ms so a long init spends no CPU.
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    NcclResult state = kNcclInProgress;
    const NcclResult result = nccl_.comm_get_async_error(comm_, &state);
    if (result != kNcclSuccess) return result;
    if (state != kNcclInProgress || Clock::now() >= deadline) return state;
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, milliseconds(1));
  }
}

void Communicator::settle(NcclResult result, const std::string &doing) {
  if (result == kNcclInProgress) {
    result = wait_while_in_progress(Clock::now() + progress_timeout_);
    if (result == kNcclInProgress) {
      fail(Code::kTimeout, doing + ": " + who() + " waited " +
                               std::to_string(progress_timeout_.count() / 1000) +
                               " s for NCCL to set the call up (connections to peers): a peer "
                               "has probably stopped or died");
    }
  }
  if (result == kNcclSuccess) return;
  const std::string text =
      doing + ": " + who() + ": " + cause_of(result) + ": " + nccl_.describe(result, comm_);
  if (result == kNcclInvalidArgument || result == kNcclInvalidUsage) {
    // A refused argument leaves the communicator sound unless NCCL also recorded it as the
    // communicator's state (it does for non-blocking communicators in some versions).
    NcclResult state = kNcclSuccess;
    if (nccl_.comm_get_async_error(comm_, &state) == kNcclSuccess && state == kNcclSuccess) {
      throw Error(Code::kInvalidArgument, text);
    }
  }
  fail(Code::kCommunication, text);
}

void Communicator::fail(Code code, const std::string &message) {
  failure_ = message;
  abort();
  throw Error(code, message);
}

void Communicator::abort() noexcept {
  if (comm_ == nullptr) return;
  if (failure_.empty()) failure_ = "abort() was called";
  nccl_.comm_abort(comm_);  // its result says nothing more: the communicator is gone either way
  comm_ = nullptr;
}

void Communicator::check_async_error() {
  const NcclComm comm = live_comm("check_async_error");
  NcclResult state = kNcclSuccess;
  const NcclResult result = nccl_.comm_get_async_error(comm, &state);
  if (result != kNcclSuccess) state = result;
  if (state == kNcclSuccess || state == kNcclInProgress) return;
  fail(Code::kCommunication, who() + ": asynchronous NCCL error: " + cause_of(state) + ": " +
                                 nccl_.describe(state, comm));
}

void Communicator::finalize(std::chrono::milliseconds timeout) {
  const NcclComm comm = live_comm("finalize");
  ScopedDevice current(cuda_, device_);
  // ncclCommFinalize flushes the queued operations without blocking; the communicator reports
  // success once they are done, and only then does ncclCommDestroy free it without waiting.
  NcclResult result = nccl_.comm_finalize(comm);
  if (result == kNcclSuccess || result == kNcclInProgress) {
    result = wait_while_in_progress(Clock::now() + timeout);
  }
  if (result == kNcclInProgress) {
    fail(Code::kTimeout, who() + ": ncclCommFinalize did not finish within " +
                             std::to_string(timeout.count()) +
                             " ms: queued operations wait for a peer that has stopped?");
  }
  if (result != kNcclSuccess) {
    fail(Code::kCommunication,
         who() + ": ncclCommFinalize: " + cause_of(result) + ": " + nccl_.describe(result, comm));
  }
  comm_ = nullptr;
  result = nccl_.comm_destroy(comm);
  if (result != kNcclSuccess) {
    failure_ = "ncclCommDestroy failed";
    throw Error(Code::kCommunication,
                who() + ": ncclCommDestroy: " + nccl_.describe(result, nullptr));
  }
}

void Communicator::allreduce(const void *send, void *recv, size_t count, DataType type, ReduceOp op,
                             CudaStream stream) {
  const std::string doing = describe_call("allreduce", count, type) + " (" + name_of(op) + ")";
  const NcclComm comm = live_comm(doing.c_str());
  if (count == 0) return;
  ScopedDevice current(cuda_, device_);
  settle(nccl_.all_reduce(send, recv, count, to_nccl(type), op_for(op, size_), comm, stream),
         doing);
}

void Communicator::reduce(const void *send, void *recv, size_t count, DataType type, ReduceOp op,
                          int root, CudaStream stream) {
  const std::string doing = describe_call("reduce", count, type) + " (" + name_of(op) +
                            ") to rank " + std::to_string(root);
  const NcclComm comm = live_comm(doing.c_str());
  if (root < 0 || root >= size_) {
    throw Error(Code::kInvalidArgument, doing + ": root is not in 0.." + std::to_string(size_ - 1));
  }
  if (count == 0) return;
  ScopedDevice current(cuda_, device_);
  settle(nccl_.reduce(send, recv, count, to_nccl(type), op_for(op, size_), root, comm, stream),
         doing);
}

void Communicator::broadcast(const void *send, void *recv, size_t count, DataType type, int root,
                             CudaStream stream) {
  const std::string doing =
      describe_call("broadcast", count, type) + " from rank " + std::to_string(root);
  const NcclComm comm = live_comm(doing.c_str());
  if (root < 0 || root >= size_) {
    throw Error(Code::kInvalidArgument, doing + ": root is not in 0.." + std::to_string(size_ - 1));
  }
  if (count == 0) return;
  ScopedDevice current(cuda_, device_);
  settle(nccl_.broadcast(send, recv, count, moved_as(type), root, comm, stream), doing);
}

void Communicator::allgather(const void *send, void *recv, size_t count, DataType type,
                             CudaStream stream) {
  const std::string doing = describe_call("allgather", count, type);
  const NcclComm comm = live_comm(doing.c_str());
  if (count == 0) return;
  ScopedDevice current(cuda_, device_);
  settle(nccl_.all_gather(send, recv, count, moved_as(type), comm, stream), doing);
}

void Communicator::allgatherv(const void *send, void *recv, std::span<const size_t> counts,
                              DataType type, CudaStream stream) {
  const std::string doing = std::string("allgatherv of ") + name_of(type);
  const NcclComm comm = live_comm(doing.c_str());
  if (counts.size() != static_cast<size_t>(size_)) {
    throw Error(Code::kInvalidArgument, doing + ": " + std::to_string(counts.size()) +
                                            " counts for " + std::to_string(size_) + " ranks");
  }
  if (std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; })) {
    allgather(send, recv, counts[0], type, stream);
    return;
  }
  ScopedDevice current(cuda_, device_);
  NcclResult first_error = nccl_.group_start();
  size_t offset = 0;
  for (int root = 0; root < size_ && first_error == kNcclSuccess; ++root) {
    const size_t count = counts[static_cast<size_t>(root)];
    void *slot = at(recv, offset, type);
    offset += count;
    if (count == 0) continue;  // the counts are the same everywhere, so every rank skips it
    const void *source = root == rank_ ? send : slot;
    const NcclResult result =
        nccl_.broadcast(source, slot, count, moved_as(type), root, comm, stream);
    if (result != kNcclSuccess && result != kNcclInProgress) first_error = result;
  }
  const NcclResult end = nccl_.group_end();  // always, to close the group
  settle(first_error != kNcclSuccess ? first_error : end, doing);
}

void Communicator::reducescatter(const void *send, void *recv, size_t recv_count, DataType type,
                                 ReduceOp op, CudaStream stream) {
  const std::string doing =
      describe_call("reducescatter", recv_count, type) + " per rank (" + name_of(op) + ")";
  const NcclComm comm = live_comm(doing.c_str());
  if (recv_count == 0) return;
  ScopedDevice current(cuda_, device_);
  settle(
      nccl_.reduce_scatter(send, recv, recv_count, to_nccl(type), op_for(op, size_), comm, stream),
      doing);
}

void Communicator::alltoallv(const void *send, std::span<const size_t> send_counts, void *recv,
                             std::span<const size_t> recv_counts, DataType type,
                             CudaStream stream) {
  const std::string doing = std::string("alltoallv of ") + name_of(type);
  const NcclComm comm = live_comm(doing.c_str());
  if (send_counts.size() != static_cast<size_t>(size_) ||
      recv_counts.size() != static_cast<size_t>(size_)) {
    throw Error(Code::kInvalidArgument,
                doing + ": " + std::to_string(send_counts.size()) + " send counts and " +
                    std::to_string(recv_counts.size()) + " receive counts for " +
                    std::to_string(size_) + " ranks");
  }
  ScopedDevice current(cuda_, device_);
  size_t send_offset = 0;
  size_t recv_offset = 0;
  std::vector<size_t> send_at(send_counts.size());
  std::vector<size_t> recv_at(recv_counts.size());
  for (size_t r = 0; r < send_counts.size(); ++r) {
    send_at[r] = send_offset;
    recv_at[r] = recv_offset;
    send_offset += send_counts[r];
    recv_offset += recv_counts[r];
  }
  const auto self = static_cast<size_t>(rank_);
  if (recv_counts[self] != send_counts[self]) {
    throw Error(Code::kInvalidArgument, doing + ": sends " + std::to_string(send_counts[self]) +
                                            " elements to itself (rank " + std::to_string(rank_) +
                                            ") but expects " + std::to_string(recv_counts[self]));
  }
  if (send_counts[self] > 0) {
    cuda_.check(
        cuda_.memcpy_async(at(recv, recv_at[self], type), at(send, send_at[self], type),
                           send_counts[self] * element_size(type), kCudaMemcpyDefault, stream),
        doing + ": cudaMemcpyAsync of this rank's own block");
  }
  NcclResult first_error = nccl_.group_start();
  for (int peer = 0; peer < size_ && first_error == kNcclSuccess; ++peer) {
    const auto p = static_cast<size_t>(peer);
    if (peer == rank_) continue;
    NcclResult result = kNcclSuccess;
    if (send_counts[p] > 0) {
      result = nccl_.send(at(send, send_at[p], type), send_counts[p], moved_as(type), peer, comm,
                          stream);
    }
    if (recv_counts[p] > 0 && (result == kNcclSuccess || result == kNcclInProgress)) {
      result = nccl_.recv(at(recv, recv_at[p], type), recv_counts[p], moved_as(type), peer, comm,
                          stream);
    }
    if (result != kNcclSuccess && result != kNcclInProgress) first_error = result;
  }
  const NcclResult end = nccl_.group_end();
  settle(first_error != kNcclSuccess ? first_error : end, doing);
}

}  // namespace perseus::comm::nccl

#include "lib/comm/host_executor.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "lib/comm/error.h"
#include "lib/comm/reduction.h"
#include "lib/comm/shm/local_allreduce.h"
#include "lib/comm/solo/backend.h"

namespace perseus::comm {

namespace {

bool overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
  const auto *x = static_cast<const uint8_t *>(a);
  const auto *y = static_cast<const uint8_t *>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

}  // namespace

HostExecutor::HostExecutor(int rank, std::unique_ptr<transport::Backend> world,
                           std::unique_ptr<shm::LocalAllreduce> local, ConnectSet connect_set)
    : rank_(rank),
      world_(std::move(world)),
      local_(std::move(local)),
      connect_set_(std::move(connect_set)) {}

HostExecutor::~HostExecutor() = default;

void HostExecutor::add_set(int set, const std::vector<int> &ranks) {
  const auto at = std::find(ranks.begin(), ranks.end(), rank_);
  if (at == ranks.end()) return;
  if (ranks.size() == 1) {
    sets_[set] = std::make_unique<solo::Backend>();
  } else {
    sets_[set] =
        connect_set_(set, static_cast<int>(at - ranks.begin()), static_cast<int>(ranks.size()));
  }
}

void HostExecutor::close() {
  world_.reset();
  finish();
}

void HostExecutor::finish() {
  sets_.clear();
  local_.reset();
}

transport::Backend &HostExecutor::backend(int set) {
  if (set == 0 && world_) return *world_;
  const auto found = sets_.find(set);
  if (set != 0 && found != sets_.end()) return *found->second;
  throw Error(Code::kInternal, "the host executor has no connection for process set " +
                                   std::to_string(set) + " (closed, or not a member)");
}

void HostExecutor::allgather(const void *mine, size_t bytes, void *out) {
  if (local_) {
    local_->allgather(mine, bytes, out);  // every rank on this host
  } else {
    backend(0).allgather(mine, out, bytes, DataType::kUint8);
  }
}

uint8_t *HostExecutor::fusion(size_t bytes) {
  if (fusion_.size() < bytes) fusion_.resize(bytes);
  return fusion_.data();
}

void HostExecutor::reduce_in_place(int set, void *buffer, size_t count, DataType type,
                                   ReduceOp op) {
  if (set == 0 && local_) {
    local_->allreduce(buffer, count, type, op);
  } else {
    backend(set).allreduce(buffer, buffer, count, type, op);
  }
}

HostExecutor::AllreduceTimes HostExecutor::allreduce(int set, const std::vector<Piece> &pieces,
                                                     DataType type, ReduceOp op, Scaling scaling) {
  AllreduceTimes times;
  times.by = set == 0 && local_ ? "SHM_ALLREDUCE" : "GLOO_ALLREDUCE";
  times.packed = Clock::now();
  times.reduced = times.packed;
  const size_t unit = element_size(type);
  size_t total = 0;
  for (const Piece &p : pieces) total += p.count;
  if (total == 0) return times;
  if (pieces.size() == 1 && pieces[0].send) {  // one tensor is reduced where it lies
    const Piece &p = pieces[0];
    if (set == 0 && local_ && scaling.prescale == 1.0) {
      local_->allreduce(p.send, p.recv, total, type, op);  // reads the input where it lies
    } else {
      if (p.send != p.recv) std::memcpy(p.recv, p.send, total * unit);
      scale_elements(p.recv, total, type, scaling.prescale);
      reduce_in_place(set, p.recv, total, type, op);
    }
    scale_elements(p.recv, total, type, scaling.postscale);
    times.reduced = Clock::now();
    return times;
  }
  times.fused = true;
  uint8_t *buffer = fusion(total * unit);
  size_t offset = 0;
  for (const Piece &p : pieces) {
    const size_t n = p.count * unit;
    if (n == 0) continue;  // an empty tensor may have null buffers
    if (p.send) {
      std::memcpy(buffer + offset, p.send, n);
    } else {
      std::memset(buffer + offset, 0, n);  // a joined rank adds nothing
    }
    offset += n;
  }
  times.packed = Clock::now();
  scale_elements(buffer, total, type, scaling.prescale);
  reduce_in_place(set, buffer, total, type, op);
  scale_elements(buffer, total, type, scaling.postscale);
  times.reduced = Clock::now();
  offset = 0;
  for (const Piece &p : pieces) {
    const size_t n = p.count * unit;
    if (p.recv && n > 0) std::memcpy(p.recv, buffer + offset, n);
    offset += n;
  }
  return times;
}

void HostExecutor::broadcast(int set, void *buffer, size_t bytes, int root) {
  if (bytes == 0) return;
  std::vector<uint8_t> scratch;
  if (!buffer) {
    scratch.resize(bytes);
    buffer = scratch.data();
  }
  backend(set).broadcast(buffer, bytes, DataType::kUint8, root);
}

void HostExecutor::allgatherv(int set, const void *send, void *out,
                              const std::vector<size_t> &bytes) {
  size_t total = 0;
  for (size_t n : bytes) total += n;
  if (total == 0) return;
  uint8_t dummy = 0;
  if (set == 0 && local_ &&
      *std::max_element(bytes.begin(), bytes.end()) <= shm::LocalAllreduce::kSmallBytes) {
    local_->allgatherv(send ? send : &dummy, out, bytes);  // every rank on this host
    return;
  }
  backend(set).allgatherv(send ? send : &dummy, out, bytes);
}

void HostExecutor::alltoallv(int set, const void *send, const std::vector<size_t> &send_bytes,
                             void *recv, const std::vector<size_t> &recv_bytes) {
  uint8_t dummy_out = 0;
  uint8_t dummy_in = 0;
  backend(set).alltoallv(send ? send : &dummy_out, send_bytes, recv ? recv : &dummy_in, recv_bytes);
}

void HostExecutor::reducescatter(int set, const void *send, void *recv,
                                 const std::vector<size_t> &counts, int me, DataType type,
                                 ReduceOp op, Scaling scaling) {
  const size_t unit = element_size(type);
  size_t total = 0;
  size_t first = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (static_cast<int>(i) == me) first = total;
    total += counts[i];
  }
  const size_t mine = counts.at(static_cast<size_t>(me));
  if (total == 0) return;
  const void *input = send;
  if (scaling.prescale != 1.0 || overlap(send, total * unit, recv, mine * unit)) {
    uint8_t *copy = fusion(total * unit);
    std::memcpy(copy, send, total * unit);
    scale_elements(copy, total, type, scaling.prescale);
    input = copy;
  }
  if (set == 0 && local_) {
    local_->reducescatter(input, total, first, mine, recv, type, op);
  } else {
    backend(set).reducescatter(input, recv, counts, type, op);
  }
  if (mine > 0) scale_elements(recv, mine, type, scaling.postscale);
}

}  // namespace perseus::comm

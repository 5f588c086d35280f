#include "lib/comm/gloo/backend.h"

#include <algorithm>
#include <cstring>
#include <exception>

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include "lib/comm/error.h"
#include "lib/comm/reduction.h"

namespace perseus::comm::gloo {

namespace {

// The slot prefix of our own ring reduce-scatter, beside Gloo's (gloo/types.h uses 0x01..0x08).
constexpr uint8_t kReducescatterSlotPrefix = 0x50;

// Gloo reports a lost peer and a timeout alike as IoException; only its text tells them apart
// (gloo/transport/tcp/{pair,unbound_buffer}.cc: "Timed out waiting ...").
Error translate(const ::gloo::IoException &error, const std::string &prefix) {
  const std::string what = error.what();
  if (what.find("Timed out") != std::string::npos) {
    return Error(Code::kTimeout, prefix + "a peer did not take part in time: " + what +
                                     " (PERSEUS_COLLECTIVE_TIMEOUT sets the limit in seconds; "
                                     "do all ranks call the same collectives in the same order?)");
  }
  return Error(Code::kCommunication,
               prefix + "lost the connection to a peer, which has probably died: " + what +
                   ". The job cannot go on: exit with a non-zero code and perseusrun ends the "
                   "other ranks");
}

// Runs one Gloo call, turning Gloo's exceptions into ours, with `doing` in front of the
// message (the collectives need none: c_api.cc names the call). Errors of our own (the
// store's) pass unchanged; anything else is a bug.
template <typename F>
void guarded(const std::string &doing, F &&call) {
  const std::string prefix = doing.empty() ? "" : doing + ": ";
  try {
    call();
  } catch (const Error &) {
    throw;
  } catch (const ::gloo::IoException &error) {
    throw translate(error, prefix);
  } catch (const std::exception &error) {
    throw Error(Code::kInternal, prefix + "Gloo failed: " + error.what());
  }
}

// Gloo needs only the element size of buffers it moves (the reduce function knows the type),
// so an unsigned integer of that size stands for every type.
template <typename Options>
void set_output(Options &options, void *buffer, size_t count, size_t element) {
  switch (element) {
    case 1:
      return options.template setOutput<uint8_t>(static_cast<uint8_t *>(buffer), count);
    case 2:
      return options.template setOutput<uint16_t>(static_cast<uint16_t *>(buffer), count);
    case 4:
      return options.template setOutput<uint32_t>(static_cast<uint32_t *>(buffer), count);
    default:
      return options.template setOutput<uint64_t>(static_cast<uint64_t *>(buffer), count);
  }
}

std::shared_ptr<::gloo::transport::Device> listen(const JobEnvironment &job,
                                                  const std::string &address) {
  ::gloo::transport::tcp::attr attr;
  if (job.gloo_iface.empty()) {
    attr.hostname = address;
  } else {
    attr.iface = job.gloo_iface;
  }
  const std::string on = job.gloo_iface.empty()
                             ? "address " + address
                             : "interface " + job.gloo_iface + " (PERSEUS_GLOO_IFACE)";
  try {
    return ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception &error) {
    throw Error(Code::kCommunication, "rank " + std::to_string(job.rank) +
                                          " could not listen for its peers on " + on + ": " +
                                          error.what());
  }
}

// How long a pair's first connection may take. Gloo waits five times the timeout it is given
// for it (gloo/transport/tcp/pair.h, waitUntil: "a longer timeout when waiting for initial
// connect"), so it is given a fifth of the limit meant. By the time a pair connects, its peer has
// published its address and every lower rank's too, so the wait is for the peer's progress, not
// for late ranks (those are waited for in the store, within PERSEUS_INIT_TIMEOUT): the limit only
// bounds a peer that died or left after publishing. In an elastic world that peer may have left
// for the next world, and the join moves on after kElasticConnectTimeout at most.
constexpr std::chrono::milliseconds kElasticConnectTimeout{10000};
constexpr int kGlooConnectFactor = 5;

}  // namespace

std::chrono::milliseconds connect_timeout(const JobEnvironment &job) {
  const auto limit = job.elastic_world >= 0 ? std::min(job.init_timeout, kElasticConnectTimeout)
                                            : job.init_timeout;
  return std::max(limit / kGlooConnectFactor, std::chrono::milliseconds(1));
}

Backend::Backend(const JobEnvironment &job, ::gloo::rendezvous::Store &store,
                 const std::string &address) {
  auto device = listen(job, address);
  context_ = std::make_shared<::gloo::rendezvous::Context>(job.rank, job.size);
  context_->setTimeout(connect_timeout(job));
  guarded("rank " + std::to_string(job.rank) + " connecting to the other " +
              std::to_string(job.size - 1) + " ranks from " + device->str(),
          [&] { context_->connectFullMesh(store, device); });
  context_->setTimeout(job.collective_timeout);
}

void Backend::allreduce(const void *send, void *recv, size_t count, DataType type, ReduceOp op) {
  // Out of place becomes in place: Gloo's own out-of-place path is the same copy.
  if (send != recv) std::memcpy(recv, send, count * element_size(type));
  guarded("", [&] {
    ::gloo::AllreduceOptions options(context_);
    options.setTag(next_tag());
    set_output(options, recv, count, element_size(type));
    options.setReduceFunction(reduce_function(type, op));
    ::gloo::allreduce(options);
  });
  if (op == ReduceOp::kAverage) divide_elements(recv, count, type, context_->size);
}

void Backend::broadcast(void *buffer, size_t count, DataType type, int root) {
  guarded("", [&] {
    ::gloo::BroadcastOptions options(context_);
    options.setTag(next_tag());
    options.setRoot(root);
    set_output(options, buffer, count, element_size(type));
    ::gloo::broadcast(options);
  });
}

void Backend::allgather(const void *send, void *recv, size_t count, DataType type) {
  const size_t bytes = count * element_size(type);
  auto *slot = static_cast<uint8_t *>(recv) + static_cast<size_t>(context_->rank) * bytes;
  if (send != slot) std::memcpy(slot, send, bytes);  // the runtime ruled out any overlap
  guarded("", [&] {
    ::gloo::AllgatherOptions options(context_);
    options.setTag(next_tag());
    set_output(options, recv, count * static_cast<size_t>(context_->size), element_size(type));
    ::gloo::allgather(options);
  });
}

void Backend::barrier() {
  guarded("", [&] {
    ::gloo::BarrierOptions options(context_);
    options.setTag(next_tag());
    ::gloo::barrier(options);
  });
}

void Backend::allgatherv(const void *send, void *recv, const std::vector<size_t> &counts) {
  guarded("", [&] {
    ::gloo::AllgathervOptions options(context_);
    options.setTag(next_tag());
    // Gloo reads the input from its own pointer, which need not be inside the output.
    options.setInput(const_cast<uint8_t *>(static_cast<const uint8_t *>(send)),
                     counts[static_cast<size_t>(context_->rank)]);
    options.setOutput(static_cast<uint8_t *>(recv), counts);
    ::gloo::allgatherv(options);
  });
}

void Backend::alltoallv(const void *send, const std::vector<size_t> &send_counts, void *recv,
                        const std::vector<size_t> &recv_counts) {
  const std::vector<int64_t> out(send_counts.begin(), send_counts.end());
  const std::vector<int64_t> in(recv_counts.begin(), recv_counts.end());
  guarded("", [&] {
    ::gloo::AlltoallvOptions options(context_);
    options.setTag(next_tag());
    options.setInput(const_cast<uint8_t *>(static_cast<const uint8_t *>(send)), out);
    options.setOutput(static_cast<uint8_t *>(recv), in);
    ::gloo::alltoallv(options);
  });
}

void Backend::reducescatter(const void *send, void *recv, const std::vector<size_t> &counts,
                            DataType type, ReduceOp op) {
  const int size = context_->size;
  const int rank = context_->rank;
  const size_t unit = element_size(type);
  std::vector<size_t> offsets(counts.size() + 1, 0);
  for (size_t r = 0; r < counts.size(); ++r) offsets[r + 1] = offsets[r] + counts[r];
  const size_t largest = *std::max_element(counts.begin(), counts.end());
  const size_t mine = counts[static_cast<size_t>(rank)];
  const auto *input = static_cast<const uint8_t *>(send);
  if (size == 1) {
    if (mine > 0) std::memcpy(recv, input, mine * unit);
    return;
  }
  if (offsets.back() == 0) return;
  if (work_.size() < offsets.back() * unit) work_.resize(offsets.back() * unit);
  if (arrived_.size() < largest * unit) arrived_.resize(largest * unit);
  const ReduceFunction reduce = reduce_function(type, op);
  const int next = (rank + 1) % size;
  const int previous = (rank + size - 1) % size;
  const auto block = [size](int b) { return static_cast<size_t>(((b % size) + size) % size); };
  guarded("", [&] {
    const uint64_t slot = ::gloo::Slot::build(kReducescatterSlotPrefix, next_tag());
    // The first block sent is this rank's own input, every later one a partial sum received
    // (and added to) in the step before; the last block received is this rank's result, added
    // straight into recv. No copy of the input is made.
    auto first = context_->createUnboundBuffer(const_cast<uint8_t *>(input), offsets.back() * unit);
    auto partials = context_->createUnboundBuffer(work_.data(), offsets.back() * unit);
    auto incoming = context_->createUnboundBuffer(arrived_.data(), largest * unit);
    const auto timeout = context_->getTimeout();
    for (int step = 0; step + 1 < size; ++step) {
      const size_t out = block(rank - 1 - step);
      const size_t in = block(rank - 2 - step);
      auto &outgoing = step == 0 ? first : partials;
      if (counts[in] > 0) incoming->recv(previous, slot, 0, counts[in] * unit);
      if (counts[out] > 0) outgoing->send(next, slot, offsets[out] * unit, counts[out] * unit);
      if (counts[in] > 0) {
        incoming->waitRecv(timeout);
        void *sum = in == static_cast<size_t>(rank) ? recv : work_.data() + offsets[in] * unit;
        reduce(sum, input + offsets[in] * unit, arrived_.data(), counts[in]);
      }
      if (counts[out] > 0) outgoing->waitSend(timeout);
    }
  });
  if (mine > 0 && op == ReduceOp::kAverage) divide_elements(recv, mine, type, size);
}

}  // namespace perseus::comm::gloo

#include "lib/comm/runtime.h"

#include <csignal>
#include <cstdint>
#include <limits>
#include <vector>

#include "lib/comm/error.h"
#include "lib/comm/gloo/backend.h"
#include "lib/comm/local_address.h"
#include "lib/comm/rendezvous_store.h"
#include "lib/rendezvous/client.h"

namespace perseus::comm {

namespace {

std::string seconds_of(std::chrono::milliseconds timeout) {
  return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout).count());
}

rendezvous::Secret read_secret(const JobEnvironment &job) {
  try {
    return rendezvous::Client::read_secret_file(job.secret_file);
  } catch (const rendezvous::WireError &error) {
    throw Error(Code::kRendezvous, "rank " + std::to_string(job.rank) +
                                       " could not read the job's secret: " + error.what() +
                                       " (perseusrun writes it and removes it when the job ends)");
  }
}

std::unique_ptr<rendezvous::Client> open_store(const JobEnvironment &job) {
  const auto secret = read_secret(job);
  try {
    return std::make_unique<rendezvous::Client>(job.rendezvous_addr, job.rendezvous_port, secret,
                                                job.init_timeout);
  } catch (const rendezvous::WireError &error) {
    throw Error(Code::kRendezvous,
                "rank " + std::to_string(job.rank) + " could not join the job's rendezvous " +
                    "store within " + seconds_of(job.init_timeout) + " s: " + error.what() +
                    " (is perseusrun still running? PERSEUS_INIT_TIMEOUT sets the limit)");
  }
}

// Gloo writes to its sockets with writev, which cannot say MSG_NOSIGNAL: a write to a peer that
// just died raises SIGPIPE, whose default action kills this rank silently before Gloo can
// report the lost peer. So SIGPIPE is ignored (as Python does at start-up), unless the program
// has its own handler; the write then fails with EPIPE, which Gloo reports.
void ignore_sigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

std::unique_ptr<transport::Backend> connect(const JobEnvironment &job, int generation) {
  ignore_sigpipe();
  const auto client = open_store(job);
  const std::string address = address_toward(job.rendezvous_addr, job.rendezvous_port);
  RendezvousStore store(*client, "perseus/comm/" + std::to_string(generation) + "/gloo/", job.rank,
                        job.init_timeout);
  // The store is needed only to meet: the client's connection closes on return.
  return std::make_unique<gloo::Backend>(job, store, address);
}

Error invalid(const std::string &message) { return Error(Code::kInvalidArgument, message); }

void require_buffer(const void *pointer, const char *argument, size_t count) {
  if (!pointer) {
    throw invalid(std::string(argument) + " is NULL while count is " + std::to_string(count) +
                  " (NULL is allowed only with count 0)");
  }
}

// count * element size * ranks, refusing a product that does not fit size_t.
size_t byte_count(size_t count, DataType type, int ranks) {
  const size_t unit = element_size(type) * static_cast<size_t>(ranks);
  if (count > std::numeric_limits<size_t>::max() / unit) {
    throw invalid("count " + std::to_string(count) + " of " + name_of(type) +
                  " is too large: its size in bytes does not fit size_t");
  }
  return count * unit;
}

bool overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

}  // namespace

Runtime::Runtime(JobEnvironment job, int generation)
    : job_(std::move(job)), backend_(connect(job_, generation)) {}

void Runtime::allreduce(const void *send, void *recv, size_t count, int dtype, int op) {
  const DataType type = to_data_type(dtype);
  const ReduceOp reduce = to_reduce_op(op);
  if (count == 0) return;
  require_buffer(send, "send", count);
  require_buffer(recv, "recv", count);
  const size_t bytes = byte_count(count, type, 1);
  if (send != recv && overlap(send, bytes, recv, bytes)) {
    throw invalid("send and recv overlap but are not equal: pass the same pointer for in place");
  }
  std::lock_guard lock(mutex_);
  backend_->allreduce(send, recv, count, type, reduce);
}

void Runtime::broadcast(void *buffer, size_t count, int dtype, int root) {
  const DataType type = to_data_type(dtype);
  if (root < 0 || root >= job_.size) {
    throw invalid("root " + std::to_string(root) + " is not a rank of this job (ranks 0 to " +
                  std::to_string(job_.size - 1) + ")");
  }
  if (count == 0) return;
  require_buffer(buffer, "buf", count);
  byte_count(count, type, 1);
  std::lock_guard lock(mutex_);
  backend_->broadcast(buffer, count, type, root);
}

void Runtime::allgather(const void *send, void *recv, size_t count, int dtype) {
  const DataType type = to_data_type(dtype);
  if (count == 0) return;
  require_buffer(send, "send", count);
  require_buffer(recv, "recv", count);
  const size_t bytes = byte_count(count, type, 1);
  const size_t total = byte_count(count, type, job_.size);
  const void *slot = static_cast<const uint8_t *>(recv) + static_cast<size_t>(job_.rank) * bytes;
  // An input inside recv but not at this rank's place (send == recv, say) would be overwritten
  // while it is being sent: take a copy first.
  std::vector<uint8_t> copy;
  if (send != slot && overlap(send, bytes, recv, total)) {
    const auto *from = static_cast<const uint8_t *>(send);
    copy.assign(from, from + bytes);
    send = copy.data();
  }
  std::lock_guard lock(mutex_);
  backend_->allgather(send, recv, count, type);
}

void Runtime::barrier() {
  std::lock_guard lock(mutex_);
  backend_->barrier();
}

}  // namespace perseus::comm

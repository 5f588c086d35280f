// The exported functions of include/perseus/perseus.h. Each one runs its body inside guarded(),
// the one place that turns exceptions into result codes and the thread's last-error message:
// no exception crosses the C ABI.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <vector>

#include <openssl/crypto.h>

#include "lib/comm/error.h"
#include "lib/comm/launcher_bootstrap.h"
#include "lib/comm/nccl/device_executor.h"
#include "lib/comm/nccl/nccl_api.h"
#include "lib/comm/negotiation.h"
#include "lib/comm/runtime.h"
#include "lib/comm/types.h"
#include "lib/rendezvous/server.h"
#include "lib/rendezvous/wire.h"
#include "perseus/perseus.h"

namespace perseus::comm {

namespace {

static_assert(PERSEUS_ERROR_INVALID_ARGUMENT == static_cast<int>(Code::kInvalidArgument));
static_assert(PERSEUS_ERROR_NOT_INITIALIZED == static_cast<int>(Code::kNotInitialized));
static_assert(PERSEUS_ERROR_RENDEZVOUS == static_cast<int>(Code::kRendezvous));
static_assert(PERSEUS_ERROR_COMMUNICATION == static_cast<int>(Code::kCommunication));
static_assert(PERSEUS_ERROR_TIMEOUT == static_cast<int>(Code::kTimeout));
static_assert(PERSEUS_ERROR_INTERNAL == static_cast<int>(Code::kInternal));
static_assert(PERSEUS_FLOAT64 == static_cast<int>(DataType::kFloat64));
static_assert(PERSEUS_BFLOAT16 == static_cast<int>(DataType::kBfloat16));
static_assert(PERSEUS_INT16 == static_cast<int>(DataType::kInt16));
static_assert(PERSEUS_PRODUCT == static_cast<int>(ReduceOp::kProduct));
static_assert(PERSEUS_AVERAGE == static_cast<int>(ReduceOp::kAverage));

// The process's one runtime. init and finalize hold the lock exclusively; every other call
// holds it shared, so that the rank queries answer while a collective blocks, and finalize
// waits for running collectives to end.
struct State {
  std::shared_mutex mutex;
  std::unique_ptr<Runtime> runtime;
  int generation = 0;      // perseus_init calls so far; the runtime's is generation - 1
  int elastic_world = -1;  // the last elastic world this process joined
};

// Never destroyed: a program that exits without perseus_finalize must not have Gloo's threads
// and sockets torn down under it by static destructors, in whatever order they run.
State &state() {
  static State *const the_state = new State;
  return *the_state;
}

// Per thread, so that one thread's failure never overwrites the message another is reading
// (NCCL's one process-wide buffer does).
thread_local std::string last_error;

int fail(Code code, const char *function, const char *name, const std::string &message) {
  try {
    last_error = std::string(function);
    if (name && *name) last_error += "('" + std::string(name) + "')";
    last_error += ": " + message;
  } catch (...) {  // out of memory for the message itself: the code still tells
  }
  return static_cast<int>(code);
}

template <typename Body>
int guarded(const char *function, const char *name, Body &&body) noexcept {
  try {
    return body();
  } catch (const Error &error) {
    return fail(error.code(), function, name, error.what());
  } catch (const std::bad_alloc &) {
    return fail(Code::kInternal, function, name, "out of memory");
  } catch (const std::exception &error) {
    return fail(
        Code::kInternal, function, name,
        std::string("unexpected failure (a bug in libperseus, please report it): ") + error.what());
  } catch (...) {
    return fail(Code::kInternal, function, name,
                "unexpected failure of an unknown kind (a bug in libperseus, please report it)");
  }
}

Runtime &initialized() {
  Runtime *runtime = state().runtime.get();
  if (!runtime) {
    throw Error(Code::kNotInitialized,
                "libperseus is not initialised: call perseus_init first (and not after "
                "perseus_finalize)");
  }
  return *runtime;
}

// Clears the shape of perseus_next_shape when a call ends, however it ends: the shape is for
// one call only.
struct ForgetShape {
  ~ForgetShape() { next_shape().reset(); }
};

// Runs `body` with the initialised runtime, under the shared lock.
template <typename Body>
int with_runtime(const char *function, const char *name, Body &&body) noexcept {
  ForgetShape forget;
  return guarded(function, name, [&] {
    std::shared_lock lock(state().mutex);
    return body(initialized());
  });
}

// A program may exit without perseus_finalize while the background thread still runs: the exit
// handlers must not tear OpenSSL down under it (its store connection signs with HMAC), and the
// thread must stop using the store once exit has begun (process_exiting()). Our handler is
// registered after OpenSSL's, so it runs first. Once per process, whichever init comes first.
void prepare_for_exit() {
  static const bool done = [] {
    OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr);
    std::atexit([] { process_exiting().store(true); });
    return true;
  }();
  (void)done;
}

const char *lookup(const char *variable) { return std::getenv(variable); }

// A runtime left behind after an elastic world ended (perseus_finalize below): its threads may
// still wait in Gloo when the process exits, and the static destructors that exit() runs would
// tear Gloo and its libraries down under them (a crash at exit, after the program's work was
// done). So the process then ends at the start of exit() with its status: a handler registered
// at the time of the leak runs before every destructor registered earlier. Output is flushed
// first; the program's own exit handlers (Python's) have run by then.
void end_quickly_at_exit(int status, void *) {
  std::fflush(nullptr);
  _exit(status);
}

void leave_runtime_behind(std::unique_ptr<Runtime> &runtime) {
  (void)runtime.release();
  static int registered = 0;
  if (registered < 8 && on_exit(end_quickly_at_exit, nullptr) == 0) registered += 1;
}

// How perseus_init joins: through MPI under an MPI launcher; alone, as a job of one rank, when
// no launcher's variable is set; else through perseusrun's variables (which names the missing
// ones when they are incomplete).
std::unique_ptr<Runtime> start_runtime(EngineSettings settings, int generation) {
  if (started_by_other_launcher(lookup)) {
    LauncherBootstrap joined = bootstrap_through_launcher(lookup);
    return std::make_unique<Runtime>(std::move(joined.job), joined.secret, std::move(settings),
                                     generation);
  }
  if (launcher_variables(lookup).empty()) {
    return Runtime::alone(alone_job_environment(lookup), std::move(settings), generation);
  }
  JobEnvironment job = read_job_environment(lookup);
  job.elastic_first_world = state().elastic_world + 1;
  auto runtime =
      std::make_unique<Runtime>(std::move(job), std::nullopt, std::move(settings), generation);
  state().elastic_world = std::max(state().elastic_world, runtime->job().elastic_world);
  return runtime;
}

// The handle perseus.h calls perseus_request_t: the caller's share of the request.
struct Handle {
  std::shared_ptr<Request> request;
};

const Request &request_of(const perseus_request_t *handle) {
  if (!handle) throw Error(Code::kInvalidArgument, "request is NULL");
  return *reinterpret_cast<const Handle *>(handle)->request;
}

int hand_out(std::shared_ptr<Request> request, perseus_request_t **out) {
  *out = reinterpret_cast<perseus_request_t *>(new Handle{std::move(request)});
  return PERSEUS_SUCCESS;
}

void require_out(perseus_request_t **out) {
  if (!out) throw Error(Code::kInvalidArgument, "request (the output pointer) is NULL");
  *out = nullptr;
}

// The handle perseus.h calls perseus_comm_t: one process set of one perseus_init. Handles are
// made once per (init, set) and never freed, so that a stale one stays readable to be refused.
struct Communicator {
  int generation;
  int set;
};

perseus_comm_t *communicator(int generation, int set) {
  static std::mutex mutex;
  static auto *const made = new std::map<std::pair<int, int>, std::unique_ptr<Communicator>>;
  std::lock_guard lock(mutex);
  auto &slot = (*made)[{generation, set}];
  if (!slot) slot = std::make_unique<Communicator>(Communicator{generation, set});
  return reinterpret_cast<perseus_comm_t *>(slot.get());
}

// The process set of `comm`, which must belong to the running perseus_init (called under the
// state's lock).
int set_of(const perseus_comm_t *comm) {
  if (!comm) throw Error(Code::kInvalidArgument, "comm is NULL (perseus_comm_world gives one)");
  const auto *c = reinterpret_cast<const Communicator *>(comm);
  const int current = state().generation - 1;
  if (c->generation != current) {
    throw Error(Code::kInvalidArgument,
                "comm (process set " + std::to_string(c->set) + ") belongs to perseus_init #" +
                    std::to_string(c->generation + 1) + ", not to the running one (#" +
                    std::to_string(current + 1) +
                    "): get this world's with perseus_comm_world or perseus_comm_create");
  }
  return c->set;
}

void require_out(void *out, const char *what) {
  if (!out)
    throw Error(Code::kInvalidArgument, std::string(what) + " (the output pointer) is NULL");
}

// perseus_next_shape's work: checks the shape and keeps it for this thread's next call.
void set_next_shape(const int64_t *dims, int ndims) {
  next_shape().reset();
  if (ndims < 0 || static_cast<size_t>(ndims) > kMaxShapeDims) {
    throw Error(Code::kInvalidArgument, "ndims " + std::to_string(ndims) + " is not in 0.." +
                                            std::to_string(kMaxShapeDims));
  }
  if (ndims > 0 && !dims) throw Error(Code::kInvalidArgument, "dims is NULL while ndims > 0");
  std::vector<int64_t> shape(dims, dims + ndims);
  for (int i = 0; i < ndims; ++i) {
    if (shape[static_cast<size_t>(i)] < 0) {
      throw Error(Code::kInvalidArgument,
                  "dims[" + std::to_string(i) +
                      "] = " + std::to_string(shape[static_cast<size_t>(i)]) + " is negative");
    }
  }
  next_shape() = std::move(shape);
}

// A blocking call: submit, wait, and the request is freed with the shared pointer.
int finish(const std::shared_ptr<Request> &request) {
  request->wait();
  return PERSEUS_SUCCESS;
}

}  // namespace

}  // namespace perseus::comm

using perseus::comm::finish;
using perseus::comm::hand_out;
using perseus::comm::request_of;
using perseus::comm::require_out;
using perseus::comm::Runtime;
using perseus::comm::with_runtime;
namespace {
using perseus::comm::communicator;
using perseus::comm::set_of;
}  // namespace

extern "C" {

PERSEUS_API int perseus_version(void) { return PERSEUS_VERSION_CODE; }

PERSEUS_API int perseus_gloo_built(void) { return 1; }

// 1 when NCCL and the CUDA runtime load and see a GPU here: device memory can then be passed.
PERSEUS_API int perseus_nccl_built(void) {
  return perseus::comm::guarded("perseus_nccl_built", nullptr, [] {
    return perseus::comm::nccl::nccl_available(nullptr) ? 1 : 0;
  });
}

PERSEUS_API int perseus_nccl_version(void) {
  return perseus::comm::guarded("perseus_nccl_version", nullptr, [] {
    return perseus::comm::nccl::nccl_available(nullptr) ? perseus::comm::nccl::nccl_api().version
                                                        : 0;
  });
}

PERSEUS_API int perseus_init(void) {
  using namespace perseus::comm;
  return guarded("perseus_init", nullptr, [] {
    std::unique_lock lock(state().mutex);
    if (state().runtime) return PERSEUS_SUCCESS;
    prepare_for_exit();
    const int generation = state().generation++;
    auto settings = read_engine_settings(lookup);
    state().runtime = start_runtime(std::move(settings), generation);
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_serve_rendezvous(const char *bind_address, char *address,
                                         size_t address_size, int *port, unsigned char secret[32]) {
  using namespace perseus::comm;
  return guarded("perseus_serve_rendezvous", nullptr, [&] {
    if (!bind_address || !address || !port || !secret) {
      throw Error(Code::kInvalidArgument, "bind_address, address, port and secret must be given");
    }
    const auto key = perseus::rendezvous::random_secret();
    std::unique_ptr<perseus::rendezvous::Server> server;
    try {
      server = std::make_unique<perseus::rendezvous::Server>(key, bind_address);
    } catch (const perseus::rendezvous::WireError &error) {
      throw Error(Code::kRendezvous, std::string("cannot serve the rendezvous store on ") +
                                         bind_address + ": " + error.what());
    }
    if (server->address().size() + 1 > address_size) {
      throw Error(Code::kInvalidArgument, "address_size " + std::to_string(address_size) +
                                              " is too small for " + server->address());
    }
    std::memcpy(address, server->address().c_str(), server->address().size() + 1);
    *port = server->port();
    std::memcpy(secret, key.data(), key.size());
    // Serves until the process exits, as perseusrun's does until the job ends.
    static std::mutex servers_mutex;
    static auto *servers = new std::vector<std::unique_ptr<perseus::rendezvous::Server>>;
    std::lock_guard lock(servers_mutex);
    servers->push_back(std::move(server));
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_init_with(int rank, int size, int local_rank, int local_size,
                                  int cross_rank, int cross_size, const char *rendezvous_address,
                                  int rendezvous_port, const unsigned char secret[32]) {
  using namespace perseus::comm;
  return guarded("perseus_init_with", nullptr, [&] {
    std::unique_lock lock(state().mutex);
    if (state().runtime) return PERSEUS_SUCCESS;
    if (!rendezvous_address || !secret) {
      throw Error(Code::kInvalidArgument, "rendezvous_address and secret must be given");
    }
    const auto place = [](int r, int n, const char *what) {
      if (n < 1 || r < 0 || r >= n) {
        throw Error(Code::kInvalidArgument, std::string(what) + " rank " + std::to_string(r) +
                                                " is not below its size " + std::to_string(n));
      }
    };
    place(rank, size, "the");
    place(local_rank, local_size, "the local");
    place(cross_rank, cross_size, "the cross");
    if (rendezvous_port < 1 || rendezvous_port > 65535) {
      throw Error(Code::kInvalidArgument,
                  "rendezvous_port " + std::to_string(rendezvous_port) + " is not a port");
    }
    prepare_for_exit();
    JobEnvironment job;
    job.rank = rank;
    job.size = size;
    job.local_rank = local_rank;
    job.local_size = local_size;
    job.cross_rank = cross_rank;
    job.cross_size = cross_size;
    job.rendezvous_addr = rendezvous_address;
    job.rendezvous_port = rendezvous_port;
    read_tuning(lookup, job);
    perseus::rendezvous::Secret key{};
    std::memcpy(key.data(), secret, key.size());
    auto settings = read_engine_settings(lookup);
    const int generation = state().generation++;
    state().runtime =
        std::make_unique<Runtime>(std::move(job), key, std::move(settings), generation);
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_finalize(void) {
  using namespace perseus::comm;
  return guarded("perseus_finalize", nullptr, [] {
    std::unique_lock lock(state().mutex);
    Runtime &runtime = initialized();
    if (!runtime.shutdown()) {
      // The thread still waits on a peer: leave it, and the runtime it uses, to the exit.
      leave_runtime_behind(state().runtime);
      // An elastic world that perseusrun ended: the peer is gone, and this process may join the
      // next world while the old thread runs down (its transport's timeout).
      if (runtime.world_ended()) return PERSEUS_SUCCESS;
      throw Error(Code::kTimeout,
                  "the other ranks did not answer within PERSEUS_SHUTDOWN_TIMEOUT_SECONDS; left "
                  "the job without them (their operations fail once this process exits)");
    }
    state().runtime.reset();
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_rank(void) {
  return with_runtime("perseus_rank", nullptr, [](Runtime &r) { return r.job().rank; });
}

PERSEUS_API int perseus_size(void) {
  return with_runtime("perseus_size", nullptr, [](Runtime &r) { return r.job().size; });
}

PERSEUS_API int perseus_elastic_world(void) {
  return with_runtime("perseus_elastic_world", nullptr,
                      [](Runtime &r) { return r.job().elastic_world; });
}

PERSEUS_API int perseus_elastic_declare(void) {
  return with_runtime("perseus_elastic_declare", nullptr, [](Runtime &r) {
    r.declare_elastic();
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_elastic_hosts_updated(long long *count) {
  return with_runtime("perseus_elastic_hosts_updated", nullptr, [&](Runtime &r) {
    if (!count) throw perseus::comm::Error(perseus::comm::Code::kInvalidArgument, "count is NULL");
    *count = r.hosts_updated();
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_local_rank(void) {
  return with_runtime("perseus_local_rank", nullptr, [](Runtime &r) { return r.job().local_rank; });
}

PERSEUS_API int perseus_local_size(void) {
  return with_runtime("perseus_local_size", nullptr, [](Runtime &r) { return r.job().local_size; });
}

PERSEUS_API int perseus_cross_rank(void) {
  return with_runtime("perseus_cross_rank", nullptr, [](Runtime &r) { return r.job().cross_rank; });
}

PERSEUS_API int perseus_cross_size(void) {
  return with_runtime("perseus_cross_size", nullptr, [](Runtime &r) { return r.job().cross_size; });
}

PERSEUS_API int perseus_allreduce(const void *send, void *recv, size_t count, int dtype, int op,
                                  const char *name) {
  return with_runtime("perseus_allreduce", name, [&](Runtime &r) {
    return finish(r.allreduce(send, recv, count, dtype, op, 1.0, 1.0, name, -1, nullptr));
  });
}

PERSEUS_API int perseus_broadcast(void *buf, size_t count, int dtype, int root, const char *name) {
  return with_runtime("perseus_broadcast", name, [&](Runtime &r) {
    return finish(r.broadcast(buf, count, dtype, root, name, -1, nullptr));
  });
}

PERSEUS_API int perseus_allgather(const void *send, void *recv, size_t count, int dtype,
                                  const char *name) {
  return with_runtime("perseus_allgather", name, [&](Runtime &r) {
    r.allgather(send, recv, count, dtype, name);
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_barrier(void) {
  return with_runtime("perseus_barrier", nullptr, [](Runtime &r) {
    r.barrier();
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_allreduce_async(const void *send, void *recv, size_t count, int dtype,
                                        int op, double prescale, double postscale, const char *name,
                                        int device, void *stream, perseus_request_t **request) {
  return with_runtime("perseus_allreduce_async", name, [&](Runtime &r) {
    require_out(request);
    return hand_out(
        r.allreduce(send, recv, count, dtype, op, prescale, postscale, name, device, stream),
        request);
  });
}

PERSEUS_API int perseus_broadcast_async(void *buf, size_t count, int dtype, int root,
                                        const char *name, int device, void *stream,
                                        perseus_request_t **request) {
  return with_runtime("perseus_broadcast_async", name, [&](Runtime &r) {
    require_out(request);
    return hand_out(r.broadcast(buf, count, dtype, root, name, device, stream), request);
  });
}

PERSEUS_API int perseus_allgatherv_async(const void *send, size_t count, int dtype,
                                         const char *name, int device, void *stream,
                                         perseus_request_t **request) {
  return with_runtime("perseus_allgatherv_async", name, [&](Runtime &r) {
    require_out(request);
    return hand_out(r.allgatherv(send, count, dtype, name, device, stream), request);
  });
}

PERSEUS_API int perseus_alltoall_async(const void *send, const size_t *send_counts, int dtype,
                                       const char *name, int device, void *stream,
                                       perseus_request_t **request) {
  return with_runtime("perseus_alltoall_async", name, [&](Runtime &r) {
    require_out(request);
    return hand_out(r.alltoall(send, send_counts, dtype, name, device, stream), request);
  });
}

PERSEUS_API int perseus_reducescatter_async(const void *send, void *recv, const size_t *recv_counts,
                                            int dtype, int op, double prescale, double postscale,
                                            const char *name, int device, void *stream,
                                            perseus_request_t **request) {
  return with_runtime("perseus_reducescatter_async", name, [&](Runtime &r) {
    require_out(request);
    return hand_out(r.reducescatter(send, recv, recv_counts, dtype, op, prescale, postscale, name,
                                    device, stream),
                    request);
  });
}

PERSEUS_API int perseus_next_shape(const int64_t *dims, int ndims) {
  return perseus::comm::guarded("perseus_next_shape", nullptr, [&] {
    perseus::comm::set_next_shape(dims, ndims);
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_poll(const perseus_request_t *request) {
  return perseus::comm::guarded("perseus_poll", nullptr,
                                [&] { return request_of(request).done() ? 1 : 0; });
}

PERSEUS_API int perseus_wait(perseus_request_t *request) {
  return perseus::comm::guarded("perseus_wait", nullptr, [&] {
    request_of(request).wait();
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_output_counts(const perseus_request_t *request, size_t *counts) {
  return perseus::comm::guarded("perseus_output_counts", nullptr, [&] {
    const auto &r = request_of(request);
    if (!counts)
      throw perseus::comm::Error(perseus::comm::Code::kInvalidArgument, "counts is NULL");
    if (!r.done() || r.output_counts.empty()) {
      throw perseus::comm::Error(perseus::comm::Code::kInvalidArgument,
                                 "the request has no output: call it after a successful "
                                 "perseus_wait on an allgatherv or alltoall");
    }
    r.wait();
    std::copy(r.output_counts.begin(), r.output_counts.end(), counts);
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_output_copy(const perseus_request_t *request, void *dst) {
  return perseus::comm::guarded("perseus_output_copy", nullptr, [&] {
    const auto &r = request_of(request);
    if (!r.done() || r.output_counts.empty()) {
      throw perseus::comm::Error(perseus::comm::Code::kInvalidArgument,
                                 "the request has no output: call it after a successful "
                                 "perseus_wait on an allgatherv or alltoall");
    }
    r.wait();
    if (r.device_output) {
      if (r.device_output_bytes && !dst) {
        throw perseus::comm::Error(perseus::comm::Code::kInvalidArgument, "dst is NULL");
      }
      perseus::comm::nccl::copy_from_device(r.what.device, dst, r.device_output.get(),
                                            r.device_output_bytes);
      return PERSEUS_SUCCESS;
    }
    if (r.output.empty()) return PERSEUS_SUCCESS;
    if (!dst) {
      throw perseus::comm::Error(
          perseus::comm::Code::kInvalidArgument,
          "dst is NULL while the output holds " + std::to_string(r.output.size()) + " bytes");
    }
    std::memcpy(dst, r.output.data(), r.output.size());
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_wait_release(perseus_request_t *request) {
  const int result = perseus::comm::guarded("perseus_wait_release", nullptr, [&] {
    request_of(request).wait();
    return PERSEUS_SUCCESS;
  });
  perseus_release(request);
  return result;
}

PERSEUS_API void perseus_release(perseus_request_t *request) {
  if (!request) return;
  auto *handle = reinterpret_cast<perseus::comm::Handle *>(request);
  handle->request->wait_quietly();
  delete handle;
}

PERSEUS_API int perseus_add_process_set(const int *ranks, int count, int *process_set) {
  return with_runtime("perseus_add_process_set", nullptr, [&](Runtime &r) {
    perseus::comm::require_out(process_set, "process_set");
    *process_set = r.add_process_set(ranks, count);
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_allreduce_async_in(int process_set, const void *send, void *recv,
                                           size_t count, int dtype, int op, double prescale,
                                           double postscale, const char *name,
                                           perseus_request_t **request) {
  return with_runtime("perseus_allreduce_async_in", name, [&](Runtime &r) {
    require_out(request);
    return hand_out(r.allreduce(send, recv, count, dtype, op, prescale, postscale, name,
                                PERSEUS_DEVICE_CPU, nullptr, process_set),
                    request);
  });
}

PERSEUS_API int perseus_broadcast_async_in(int process_set, void *buf, size_t count, int dtype,
                                           int root, const char *name,
                                           perseus_request_t **request) {
  return with_runtime("perseus_broadcast_async_in", name, [&](Runtime &r) {
    require_out(request);
    return hand_out(
        r.broadcast(buf, count, dtype, root, name, PERSEUS_DEVICE_CPU, nullptr, process_set),
        request);
  });
}

PERSEUS_API int perseus_allgatherv_async_in(int process_set, const void *send, size_t count,
                                            int dtype, const char *name,
                                            perseus_request_t **request) {
  return with_runtime("perseus_allgatherv_async_in", name, [&](Runtime &r) {
    require_out(request);
    return hand_out(
        r.allgatherv(send, count, dtype, name, PERSEUS_DEVICE_CPU, nullptr, process_set), request);
  });
}

PERSEUS_API int perseus_alltoall_async_in(int process_set, const void *send,
                                          const size_t *send_counts, int dtype, const char *name,
                                          perseus_request_t **request) {
  return with_runtime("perseus_alltoall_async_in", name, [&](Runtime &r) {
    require_out(request);
    return hand_out(
        r.alltoall(send, send_counts, dtype, name, PERSEUS_DEVICE_CPU, nullptr, process_set),
        request);
  });
}

PERSEUS_API int perseus_reducescatter_async_in(int process_set, const void *send, void *recv,
                                               const size_t *recv_counts, int dtype, int op,
                                               double prescale, double postscale, const char *name,
                                               perseus_request_t **request) {
  return with_runtime("perseus_reducescatter_async_in", name, [&](Runtime &r) {
    require_out(request);
    return hand_out(r.reducescatter(send, recv, recv_counts, dtype, op, prescale, postscale, name,
                                    PERSEUS_DEVICE_CPU, nullptr, process_set),
                    request);
  });
}

PERSEUS_API int perseus_barrier_in(int process_set) {
  return with_runtime("perseus_barrier_in", nullptr, [&](Runtime &r) {
    r.barrier(process_set);
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_comm_world(perseus_comm_t **comm) {
  return with_runtime("perseus_comm_world", nullptr, [&](Runtime &) {
    perseus::comm::require_out(comm, "comm");
    *comm = communicator(perseus::comm::state().generation - 1, 0);
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_comm_create(const int *ranks, int count, perseus_comm_t **comm) {
  return with_runtime("perseus_comm_create", nullptr, [&](Runtime &r) {
    perseus::comm::require_out(comm, "comm");
    *comm = nullptr;
    const int set = r.add_process_set(ranks, count);
    *comm = communicator(perseus::comm::state().generation - 1, set);
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_comm_process_set(const perseus_comm_t *comm, int *process_set) {
  return with_runtime("perseus_comm_process_set", nullptr, [&](Runtime &) {
    perseus::comm::require_out(process_set, "process_set");
    *process_set = set_of(comm);
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_comm_rank(const perseus_comm_t *comm, int *rank) {
  return with_runtime("perseus_comm_rank", nullptr, [&](Runtime &r) {
    perseus::comm::require_out(rank, "rank");
    *rank = perseus::comm::index_of(r.members_of(set_of(comm)), r.job().rank);
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_comm_size(const perseus_comm_t *comm, int *size) {
  return with_runtime("perseus_comm_size", nullptr, [&](Runtime &r) {
    perseus::comm::require_out(size, "size");
    *size = static_cast<int>(r.members_of(set_of(comm)).size());
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_comm_allreduce_async(perseus_comm_t *comm, const void *send, void *recv,
                                             size_t count, int dtype, int op, double prescale,
                                             double postscale, const char *name, int device,
                                             void *stream, perseus_request_t **request) {
  return with_runtime("perseus_comm_allreduce_async", name, [&](Runtime &r) {
    require_out(request);
    return hand_out(r.allreduce(send, recv, count, dtype, op, prescale, postscale, name, device,
                                stream, set_of(comm)),
                    request);
  });
}

PERSEUS_API int perseus_comm_allreduce_submit(perseus_comm_t *comm,
                                              const perseus_allreduce_args_t *args,
                                              const char *name, perseus_request_t **request) {
  return with_runtime("perseus_comm_allreduce_submit", name, [&](Runtime &r) {
    require_out(request);
    using perseus::comm::Code;
    using perseus::comm::Error;
    if (!args) throw Error(Code::kInvalidArgument, "args is NULL");
    // Copied out whole first: the caller's buffer need not be aligned (a Python bytes object).
    uint32_t size = 0;
    std::memcpy(&size, args, sizeof size);
    if (size != sizeof(perseus_allreduce_args_t)) {
      throw Error(Code::kInvalidArgument,
                  "args->size is " + std::to_string(size) + ", but this libperseus's " +
                      "perseus_allreduce_args_t is " +
                      std::to_string(sizeof(perseus_allreduce_args_t)) +
                      " bytes: set it to sizeof(perseus_allreduce_args_t) (from the perseus.h " +
                      "of the libperseus that is loaded)");
    }
    perseus_allreduce_args_t a;
    std::memcpy(&a, args, sizeof a);
    if (a.ndims != -1) perseus::comm::set_next_shape(a.dims, a.ndims);
    return hand_out(r.allreduce(a.send, a.recv, a.count, a.dtype, a.op, a.prescale, a.postscale,
                                name, a.device, a.stream, set_of(comm)),
                    request);
  });
}

PERSEUS_API int perseus_comm_allreduce(perseus_comm_t *comm, const void *send, void *recv,
                                       size_t count, int dtype, int op, double prescale,
                                       double postscale, const char *name, int device,
                                       void *stream) {
  return with_runtime("perseus_comm_allreduce", name, [&](Runtime &r) {
    return finish(r.allreduce(send, recv, count, dtype, op, prescale, postscale, name, device,
                              stream, set_of(comm)));
  });
}

PERSEUS_API int perseus_comm_allreduce_many_async(
    perseus_comm_t *comm, int n, const void *const *sends, void *const *recvs, const size_t *counts,
    const int *dtypes, int op, double prescale, double postscale, const char *const *names,
    const int *ndims, const int64_t *dims, int device, void *stream, perseus_request_t **requests) {
  return with_runtime("perseus_comm_allreduce_many_async", nullptr, [&](Runtime &r) {
    using perseus::comm::Code;
    using perseus::comm::Error;
    if (n < 0) throw Error(Code::kInvalidArgument, "n " + std::to_string(n) + " is negative");
    if (n == 0) return PERSEUS_SUCCESS;
    if (!requests) throw Error(Code::kInvalidArgument, "requests (the output array) is NULL");
    std::fill(requests, requests + n, nullptr);
    if (!sends || !recvs || !counts || !dtypes) {
      throw Error(Code::kInvalidArgument, std::string(!sends    ? "sends"
                                                      : !recvs  ? "recvs"
                                                      : !counts ? "counts"
                                                                : "dtypes") +
                                              " is NULL while n is " + std::to_string(n));
    }
    const int set = set_of(comm);
    const int64_t *extents = dims;
    for (int i = 0; i < n; ++i) {
      const char *name = names ? names[i] : nullptr;
      try {
        if (ndims) {
          perseus::comm::set_next_shape(extents, ndims[i]);
          extents += ndims[i];
        }
        hand_out(r.allreduce(sends[i], recvs[i], counts[i], dtypes[i], op, prescale, postscale,
                             name, device, stream, set),
                 &requests[i]);
      } catch (const Error &error) {
        perseus::comm::next_shape().reset();
        std::string tensor = "tensor " + std::to_string(i);
        if (name) tensor += " ('" + std::string(name) + "')";
        throw Error(error.code(),
                    tensor + ": " + error.what() +
                        (i == 0 ? std::string(" (nothing was submitted)")
                                : " (tensors 0.." + std::to_string(i - 1) +
                                      " were submitted: their requests are in requests[0.." +
                                      std::to_string(i - 1) + "])"));
      }
    }
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_comm_broadcast_async(perseus_comm_t *comm, void *buf, size_t count,
                                             int dtype, int root, const char *name, int device,
                                             void *stream, perseus_request_t **request) {
  return with_runtime("perseus_comm_broadcast_async", name, [&](Runtime &r) {
    require_out(request);
    return hand_out(r.broadcast(buf, count, dtype, root, name, device, stream, set_of(comm)),
                    request);
  });
}

PERSEUS_API int perseus_comm_allgatherv_async(perseus_comm_t *comm, const void *send, size_t count,
                                              int dtype, const char *name, int device, void *stream,
                                              perseus_request_t **request) {
  return with_runtime("perseus_comm_allgatherv_async", name, [&](Runtime &r) {
    require_out(request);
    return hand_out(r.allgatherv(send, count, dtype, name, device, stream, set_of(comm)), request);
  });
}

PERSEUS_API int perseus_comm_alltoall_async(perseus_comm_t *comm, const void *send,
                                            const size_t *send_counts, int dtype, const char *name,
                                            int device, void *stream, perseus_request_t **request) {
  return with_runtime("perseus_comm_alltoall_async", name, [&](Runtime &r) {
    require_out(request);
    return hand_out(r.alltoall(send, send_counts, dtype, name, device, stream, set_of(comm)),
                    request);
  });
}

PERSEUS_API int perseus_comm_reducescatter_async(perseus_comm_t *comm, const void *send, void *recv,
                                                 const size_t *recv_counts, int dtype, int op,
                                                 double prescale, double postscale,
                                                 const char *name, int device, void *stream,
                                                 perseus_request_t **request) {
  return with_runtime("perseus_comm_reducescatter_async", name, [&](Runtime &r) {
    require_out(request);
    return hand_out(r.reducescatter(send, recv, recv_counts, dtype, op, prescale, postscale, name,
                                    device, stream, set_of(comm)),
                    request);
  });
}

PERSEUS_API int perseus_comm_barrier(perseus_comm_t *comm) {
  return with_runtime("perseus_comm_barrier", nullptr, [&](Runtime &r) {
    r.barrier(set_of(comm));
    return PERSEUS_SUCCESS;
  });
}

namespace {

// perseus_host_pack's and perseus_host_unpack's checks, made before anything is copied: the
// pieces' pointers and sizes, and the one buffer's pointer (`whole`) once any piece has bytes.
void check_pieces(const char *whole_name, const void *whole, int n, const void *const *pieces,
                  const char *pieces_name, const size_t *bytes) {
  using perseus::comm::Code;
  using perseus::comm::Error;
  if (n < 0) throw Error(Code::kInvalidArgument, "n is " + std::to_string(n) + ": give n >= 0");
  if (n == 0) return;
  if (!pieces) throw Error(Code::kInvalidArgument, std::string(pieces_name) + " is NULL");
  if (!bytes) throw Error(Code::kInvalidArgument, "bytes is NULL");
  bool any = false;
  for (int i = 0; i < n; ++i) {
    if (bytes[i] == 0) continue;
    any = true;
    if (!pieces[i]) {
      throw Error(Code::kInvalidArgument, std::string(pieces_name) + "[" + std::to_string(i) +
                                              "] is NULL, for " + std::to_string(bytes[i]) +
                                              " bytes");
    }
  }
  if (any && !whole) throw Error(Code::kInvalidArgument, std::string(whole_name) + " is NULL");
}

}  // namespace

PERSEUS_API int perseus_host_pack(void *dst, int n, const void *const *srcs, const size_t *bytes) {
  return perseus::comm::guarded("perseus_host_pack", nullptr, [&] {
    check_pieces("dst", dst, n, srcs, "srcs", bytes);
    auto *out = static_cast<unsigned char *>(dst);
    for (int i = 0; i < n; ++i) {
      if (bytes[i] == 0) continue;
      std::memcpy(out, srcs[i], bytes[i]);
      out += bytes[i];
    }
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_host_unpack(const void *src, int n, void *const *dsts,
                                    const size_t *bytes) {
  return perseus::comm::guarded("perseus_host_unpack", nullptr, [&] {
    check_pieces("src", src, n, reinterpret_cast<const void *const *>(dsts), "dsts", bytes);
    const auto *in = static_cast<const unsigned char *>(src);
    for (int i = 0; i < n; ++i) {
      if (bytes[i] == 0) continue;
      std::memcpy(dsts[i], in, bytes[i]);
      in += bytes[i];
    }
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_join(int device, int *last_rank) {
  return with_runtime("perseus_join", nullptr, [&](Runtime &r) {
    const int last = r.join(device);
    if (last_rank) *last_rank = last;
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API const char *perseus_last_error(void) { return perseus::comm::last_error.c_str(); }

}  // extern "C"

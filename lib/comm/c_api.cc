// The exported functions of include/perseus/perseus.h. Each one runs its body inside guarded(),
// the one place that turns exceptions into result codes and the thread's last-error message:
// no exception crosses the C ABI.

#include <cstdlib>
#include <memory>
#include <new>
#include <shared_mutex>
#include <string>

#include "lib/comm/error.h"
#include "lib/comm/runtime.h"
#include "lib/comm/types.h"
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
static_assert(PERSEUS_PRODUCT == static_cast<int>(ReduceOp::kProduct));
static_assert(PERSEUS_AVERAGE == static_cast<int>(ReduceOp::kAverage));

// The process's one runtime. init and finalize hold the lock exclusively; every other call
// holds it shared, so that the rank queries answer while a collective blocks, and finalize
// waits for running collectives to end.
struct State {
  std::shared_mutex mutex;
  std::unique_ptr<Runtime> runtime;
  int generation = 0;
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

// Runs `body` with the initialised runtime, under the shared lock.
template <typename Body>
int with_runtime(const char *function, const char *name, Body &&body) noexcept {
  return guarded(function, name, [&] {
    std::shared_lock lock(state().mutex);
    return body(initialized());
  });
}

}  // namespace

}  // namespace perseus::comm

using perseus::comm::Runtime;
using perseus::comm::with_runtime;

extern "C" {

PERSEUS_API int perseus_version(void) { return PERSEUS_VERSION_CODE; }

PERSEUS_API int perseus_gloo_built(void) { return 1; }

// The NCCL backend is not written yet, whatever this build found.
PERSEUS_API int perseus_nccl_built(void) { return 0; }

PERSEUS_API int perseus_init(void) {
  using namespace perseus::comm;
  return guarded("perseus_init", nullptr, [] {
    std::unique_lock lock(state().mutex);
    if (state().runtime) return PERSEUS_SUCCESS;
    const int generation = state().generation++;
    const auto lookup = [](const char *variable) -> const char * { return std::getenv(variable); };
    state().runtime = std::make_unique<Runtime>(read_job_environment(lookup), generation);
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_finalize(void) {
  using namespace perseus::comm;
  return guarded("perseus_finalize", nullptr, [] {
    std::unique_lock lock(state().mutex);
    initialized();
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
    r.allreduce(send, recv, count, dtype, op);
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_broadcast(void *buf, size_t count, int dtype, int root, const char *name) {
  return with_runtime("perseus_broadcast", name, [&](Runtime &r) {
    r.broadcast(buf, count, dtype, root);
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_allgather(const void *send, void *recv, size_t count, int dtype,
                                  const char *name) {
  return with_runtime("perseus_allgather", name, [&](Runtime &r) {
    r.allgather(send, recv, count, dtype);
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API int perseus_barrier(void) {
  return with_runtime("perseus_barrier", nullptr, [](Runtime &r) {
    r.barrier();
    return PERSEUS_SUCCESS;
  });
}

PERSEUS_API const char *perseus_last_error(void) { return perseus::comm::last_error.c_str(); }

}  // extern "C"

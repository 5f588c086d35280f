#pragma once
// One initialised libperseus: the rank's place in the job and the backend connected to every
// other rank. c_api.cc owns at most one, from perseus_init to perseus_finalize.
//
// Threads: the collectives may be called from any thread; they are serialised here, since a
// backend takes one call at a time. Ownership: the runtime owns its backend; the caller's
// buffers are only borrowed for the length of a call.

#include <memory>
#include <mutex>

#include "lib/comm/job_environment.h"
#include "lib/comm/transport/backend.h"

namespace perseus::comm {

class Runtime {
 public:
  // Joins the job: reads the secret, reaches the rendezvous store, connects the backend.
  // `generation` counts this process's perseus_init calls; it keeps the keys of a second
  // init apart from the first's. Throws Error.
  Runtime(JobEnvironment job, int generation);

  const JobEnvironment &job() const { return job_; }

  // The C ABI's collectives: check the arguments (Error(kInvalidArgument) naming the argument
  // and its value), then run them on the backend.
  void allreduce(const void *send, void *recv, size_t count, int dtype, int op);
  void broadcast(void *buffer, size_t count, int dtype, int root);
  void allgather(const void *send, void *recv, size_t count, int dtype);
  void barrier();

 private:
  JobEnvironment job_;
  std::unique_ptr<transport::Backend> backend_;
  std::mutex mutex_;  // one collective at a time
};

}  // namespace perseus::comm

#pragma once
// The Gloo backend: collectives on host memory over TCP, one connection per pair of ranks.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>

#include "lib/comm/job_environment.h"
#include "lib/comm/transport/backend.h"

namespace perseus::comm::gloo {

// The timeout Backend gives Gloo while connecting, for a pair's first connection to take at most
// job.init_timeout (at most 10 s in an elastic world) whatever Gloo multiplies it by.
std::chrono::milliseconds connect_timeout(const JobEnvironment &job);

class Backend : public transport::Backend {
 public:
  // Listens on `address` (or on the interface PERSEUS_GLOO_IFACE names), publishes it in
  // `store` and connects to every other rank, waiting at most job.init_timeout. Throws
  // Error(kCommunication) when it cannot listen or connect, Error(kTimeout) or
  // Error(kRendezvous) from the store. `store` is needed only during the constructor.
  Backend(const JobEnvironment &job, ::gloo::rendezvous::Store &store, const std::string &address);

  void allreduce(const void *send, void *recv, size_t count, DataType type, ReduceOp op) override;
  void broadcast(void *buffer, size_t count, DataType type, int root) override;
  void allgather(const void *send, void *recv, size_t count, DataType type) override;
  void barrier() override;
  void allgatherv(const void *send, void *recv, const std::vector<size_t> &counts) override;
  void alltoallv(const void *send, const std::vector<size_t> &send_counts, void *recv,
                 const std::vector<size_t> &recv_counts) override;
  // A ring: in step s (0 .. size - 2) each rank sends its partial sum of block
  // (rank - 1 - s) mod size to the next rank and adds the previous rank's partial sum of block
  // (rank - 2 - s) mod size into its own, which after the last step is block `rank` reduced
  // over every rank. Empty blocks are not sent.
  void reducescatter(const void *send, void *recv, const std::vector<size_t> &counts, DataType type,
                     ReduceOp op) override;

 private:
  // Every rank issues the same collectives in the same order, so a counter gives each one the
  // same tag on every rank, and a late message of one collective can never be taken for
  // another's.
  uint32_t next_tag() { return tag_++; }

  std::shared_ptr<::gloo::rendezvous::Context> context_;
  uint32_t tag_ = 0;
  std::vector<uint8_t> work_;     // reducescatter's partial sums
  std::vector<uint8_t> arrived_;  // reducescatter's block from the previous rank
};

}  // namespace perseus::comm::gloo

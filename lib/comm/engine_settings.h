#pragma once
// The engine's tuning: the PERSEUS_* variables a rank reads at perseus_init (perseus.h lists
// them), parsed and checked in one place.

#include <chrono>
#include <cstddef>
#include <string>

#include "lib/comm/job_environment.h"

namespace perseus::comm {

struct EngineSettings {
  // PERSEUS_FUSION_THRESHOLD: all-reduces agreed in one cycle are packed into buffers of at
  // most this many bytes (0: no fusion).
  size_t fusion_threshold = 64 * 1024 * 1024;
  // PERSEUS_CYCLE_TIME: the longest an idle background thread sleeps before it checks with
  // the other ranks (new work wakes it at once). After a second without work it sleeps up to
  // five times longer, to spare the CPU of a rank that does not communicate.
  std::chrono::microseconds cycle_time{1000};
  // PERSEUS_STALL_CHECK_SECONDS (0: off): rank 0 warns about an operation some ranks have
  // submitted and others not for this long, naming them.
  std::chrono::seconds stall_check{60};
  // PERSEUS_STALL_SHUTDOWN_SECONDS (0: never): such an operation then fails on the ranks
  // that submitted it.
  std::chrono::seconds stall_shutdown{0};
  // PERSEUS_DEADLOCK_SECONDS (0: off): when every rank is blocked waiting for operations that
  // some rank never submitted (rank 0 in a barrier, rank 1 in an all-reduce), and no rank has
  // submitted anything for this long, every one of those operations fails on every rank,
  // naming who waits for what, instead of the job hanging.
  std::chrono::seconds deadlock{10};
  std::string timeline;  // PERSEUS_TIMELINE: a file name; rank 0 writes it
  // PERSEUS_SHM (1; 0 turns it off): host all-reduces through shared memory when every rank is
  // on one host.
  bool shared_memory = true;
  // PERSEUS_ALLREDUCE_STREAMS (1..64): device all-reduces (fused buffers) are spread over this
  // many CUDA streams, each with its own NCCL communicator and fusion buffer.
  int allreduce_streams = 1;
  // PERSEUS_HIERARCHICAL_ALLREDUCE (0; 1 turns it on; HOROVOD_HIERARCHICAL_ALLREDUCE is read
  // when it is unset): device all-reduces of a job over several hosts go in two levels, inside
  // each host and across hosts (nccl/hierarchy.h). Rank 0's setting holds for the job.
  bool hierarchical_allreduce = false;
  // PERSEUS_SHUTDOWN_TIMEOUT_SECONDS (0: no limit): how long perseus_finalize waits for the
  // background thread to leave the job with the others before it gives up on them.
  std::chrono::seconds shutdown_timeout{30};
};

// Reads the PERSEUS_* tuning variables above; Error(kInvalidArgument) naming a bad value.
EngineSettings read_engine_settings(Lookup lookup);

}  // namespace perseus::comm

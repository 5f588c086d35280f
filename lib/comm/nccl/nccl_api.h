#pragma once
// The NCCL functions libperseus uses, loaded at run time from libnccl.so.2 (dlopen), so that
// libperseus links no NCCL and loads on hosts without one. No NCCL header is needed to build:
// the types below have nccl.h's C layouts and values, and NcclApi holds the functions with their
// exact C signatures (enums are passed as int, which the x86-64 and aarch64 ABIs make the same),
// so that tests can fake them.
//
// The oldest NCCL accepted is 2.18 (kNcclMinimumVersion): non-blocking communicators with
// ncclCommFinalize, ncclAvg and ncclBfloat16, ncclGetLastError, and the ncclConfig_t fields up
// to splitShare.
//
// Threads: the table is loaded once per process (thread-safe) and never unloaded.

#include <climits>
#include <cstddef>
#include <string>

#include "lib/comm/nccl/cuda_api.h"

namespace perseus::comm::nccl {

using NcclResult = int;    // ncclResult_t
using NcclDataType = int;  // ncclDataType_t
using NcclRedOp = int;     // ncclRedOp_t
struct NcclCommOpaque;
using NcclComm = NcclCommOpaque *;  // ncclComm_t

inline constexpr NcclResult kNcclSuccess = 0;
inline constexpr NcclResult kNcclUnhandledCudaError = 1;
inline constexpr NcclResult kNcclSystemError = 2;
inline constexpr NcclResult kNcclInternalError = 3;
inline constexpr NcclResult kNcclInvalidArgument = 4;
inline constexpr NcclResult kNcclInvalidUsage = 5;
inline constexpr NcclResult kNcclRemoteError = 6;
inline constexpr NcclResult kNcclInProgress = 7;

inline constexpr NcclDataType kNcclInt8 = 0;
inline constexpr NcclDataType kNcclUint8 = 1;
inline constexpr NcclDataType kNcclInt32 = 2;
inline constexpr NcclDataType kNcclInt64 = 4;
inline constexpr NcclDataType kNcclFloat16 = 6;
inline constexpr NcclDataType kNcclFloat32 = 7;
inline constexpr NcclDataType kNcclFloat64 = 8;
inline constexpr NcclDataType kNcclBfloat16 = 9;

inline constexpr NcclRedOp kNcclSum = 0;
inline constexpr NcclRedOp kNcclProd = 1;
inline constexpr NcclRedOp kNcclMax = 2;
inline constexpr NcclRedOp kNcclMin = 3;
inline constexpr NcclRedOp kNcclAvg = 4;

// NCCL_VERSION(major, minor, patch) of nccl.h, as ncclGetVersion reports it.
constexpr int nccl_version_code(int major, int minor, int patch) {
  return (major <= 2 && minor <= 8) ? major * 1000 + minor * 100 + patch
                                    : major * 10000 + minor * 100 + patch;
}
inline constexpr int kNcclMinimumVersion = nccl_version_code(2, 18, 0);

inline constexpr size_t kNcclUniqueIdBytes = 128;
struct NcclUniqueId {  // ncclUniqueId
  char internal[kNcclUniqueIdBytes];
};

// ncclConfig_t as NCCL 2.18 declared it. Later versions only append fields, and NCCL copies
// min(size, its own sizeof) bytes and gives the fields it did not get their defaults
// (init.cc, parseCommConfig), so this prefix is valid for 2.18 and every later NCCL (checked
// against 2.28's nccl.h: ncclConfig_v22800 starts with these fields).
struct NcclConfig {
  size_t size = sizeof(NcclConfig);
  unsigned int magic = 0xcafebeef;
  unsigned int version = static_cast<unsigned int>(nccl_version_code(2, 18, 0));
  int blocking = INT_MIN;  // NCCL_CONFIG_UNDEF_INT: NCCL's default
  int cga_cluster_size = INT_MIN;
  int min_ctas = INT_MIN;
  int max_ctas = INT_MIN;
  const char *net_name = nullptr;
  int split_share = INT_MIN;
};

struct NcclApi {
  NcclResult (*get_version)(int *version) = nullptr;               // ncclGetVersion
  NcclResult (*get_unique_id)(NcclUniqueId *unique_id) = nullptr;  // ncclGetUniqueId
  NcclResult (*comm_init_rank_config)(NcclComm *comm, int nranks, NcclUniqueId unique_id, int rank,
                                      NcclConfig *config) = nullptr;  // ncclCommInitRankConfig
  // ncclCommInitAll: one process driving ndev GPUs (the raw benchmark).
  NcclResult (*comm_init_all)(NcclComm *comms, int ndev, const int *devices) = nullptr;
  NcclResult (*comm_get_async_error)(NcclComm comm,
                                     NcclResult *error) = nullptr;  // ncclCommGetAsyncError
  NcclResult (*comm_abort)(NcclComm comm) = nullptr;                // ncclCommAbort
  NcclResult (*comm_finalize)(NcclComm comm) = nullptr;             // ncclCommFinalize
  NcclResult (*comm_destroy)(NcclComm comm) = nullptr;              // ncclCommDestroy
  NcclResult (*all_reduce)(const void *send, void *recv, size_t count, NcclDataType type,
                           NcclRedOp op, NcclComm comm,
                           CudaStream stream) = nullptr;  // ncclAllReduce
  NcclResult (*broadcast)(const void *send, void *recv, size_t count, NcclDataType type, int root,
                          NcclComm comm, CudaStream stream) = nullptr;  // ncclBroadcast
  NcclResult (*reduce)(const void *send, void *recv, size_t count, NcclDataType type, NcclRedOp op,
                       int root, NcclComm comm, CudaStream stream) = nullptr;  // ncclReduce
  NcclResult (*all_gather)(const void *send, void *recv, size_t send_count, NcclDataType type,
                           NcclComm comm, CudaStream stream) = nullptr;  // ncclAllGather
  NcclResult (*reduce_scatter)(const void *send, void *recv, size_t recv_count, NcclDataType type,
                               NcclRedOp op, NcclComm comm,
                               CudaStream stream) = nullptr;  // ncclReduceScatter
  NcclResult (*send)(const void *send, size_t count, NcclDataType type, int peer, NcclComm comm,
                     CudaStream stream) = nullptr;  // ncclSend
  NcclResult (*recv)(void *recv, size_t count, NcclDataType type, int peer, NcclComm comm,
                     CudaStream stream) = nullptr;               // ncclRecv
  NcclResult (*group_start)() = nullptr;                         // ncclGroupStart
  NcclResult (*group_end)() = nullptr;                           // ncclGroupEnd
  const char *(*get_error_string)(NcclResult result) = nullptr;  // ncclGetErrorString
  const char *(*get_last_error)(NcclComm comm) = nullptr;        // ncclGetLastError

  std::string library;  // the file loaded, for messages
  int version = 0;      // ncclGetVersion's code: 22809 for 2.28.9

  // "2.28.9"
  std::string version_string() const;
  // "unhandled system error (run with NCCL_DEBUG=INFO for details) (ncclSystemError = 2):
  // <ncclGetLastError's text>". comm may be null.
  std::string describe(NcclResult result, NcclComm comm) const;
};

// The process's NCCL, loaded on first use (libnccl.so.2). Throws Error(kInvalidArgument) when it
// cannot be loaded or is older than kNcclMinimumVersion; the same error on every later call.
const NcclApi &nccl_api();

// True when NCCL loads, is recent enough, and the CUDA runtime sees a GPU (cuda_available);
// else false and *why (may be null) says what is missing. Computed once per process.
bool nccl_available(std::string *why);

}  // namespace perseus::comm::nccl

#include "lib/comm/nccl/nccl_api.h"

#include <iterator>
#include <memory>

#include "lib/comm/error.h"
#include "lib/comm/nccl/shared_library.h"

namespace perseus::comm::nccl {

namespace {

const char *const kResultNames[] = {
    "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
    "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress",
};

std::string version_text(int code) {
  // Codes before 2.9 are major * 1000 + minor * 100 + patch (nccl.h's NCCL_VERSION).
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

void bind_all(const SharedLibrary &library, NcclApi &api) {
  library.bind(api.get_version, "ncclGetVersion");
  library.bind(api.get_unique_id, "ncclGetUniqueId");
  library.bind(api.comm_init_rank_config, "ncclCommInitRankConfig");
  library.bind(api.comm_init_all, "ncclCommInitAll");
  library.bind(api.comm_get_async_error, "ncclCommGetAsyncError");
  library.bind(api.comm_abort, "ncclCommAbort");
  library.bind(api.comm_finalize, "ncclCommFinalize");
  library.bind(api.comm_destroy, "ncclCommDestroy");
  library.bind(api.all_reduce, "ncclAllReduce");
  library.bind(api.broadcast, "ncclBroadcast");
  library.bind(api.reduce, "ncclReduce");
  library.bind(api.all_gather, "ncclAllGather");
  library.bind(api.reduce_scatter, "ncclReduceScatter");
  library.bind(api.send, "ncclSend");
  library.bind(api.recv, "ncclRecv");
  library.bind(api.group_start, "ncclGroupStart");
  library.bind(api.group_end, "ncclGroupEnd");
  library.bind(api.get_error_string, "ncclGetErrorString");
  library.bind(api.get_last_error, "ncclGetLastError");
}

NcclApi load_nccl() {
  const SharedLibrary library = SharedLibrary::open_first({"libnccl.so.2"}, "NCCL");
  NcclApi api;
  // The version first: a too-old NCCL lacks some functions, and "too old" says more.
  library.bind(api.get_version, "ncclGetVersion");
  const NcclResult result = api.get_version(&api.version);
  if (result != kNcclSuccess) {
    throw Error(Code::kInvalidArgument, "NCCL at " + library.path() +
                                            ": ncclGetVersion failed (ncclResult " +
                                            std::to_string(result) + ")");
  }
  if (api.version < kNcclMinimumVersion) {
    throw Error(Code::kInvalidArgument,
                "NCCL at " + library.path() + " is version " + version_text(api.version) +
                    "; libperseus needs " + version_text(kNcclMinimumVersion) +
                    " or later (non-blocking communicators). Install a newer NCCL or put its "
                    "folder first in LD_LIBRARY_PATH");
  }
  bind_all(library, api);
  api.library = library.path();
  return api;
}

struct Loaded {
  std::unique_ptr<NcclApi> api;
  std::unique_ptr<Error> error;
};

const Loaded &loaded() {
  static const Loaded once = [] {
    Loaded result;
    try {
      result.api = std::make_unique<NcclApi>(load_nccl());
    } catch (const Error &error) {
      result.error = std::make_unique<Error>(error);
    }
    return result;
  }();
  return once;
}

}  // namespace

std::string NcclApi::version_string() const { return version_text(version); }

std::string NcclApi::describe(NcclResult result, NcclComm comm) const {
  const char *text = get_error_string != nullptr ? get_error_string(result) : nullptr;
  const bool known = result >= 0 && result < static_cast<int>(std::size(kResultNames));
  std::string description = std::string(text != nullptr ? text : "unknown NCCL result") + " (" +
                            (known ? kResultNames[result] : "ncclResult") + " = " +
                            std::to_string(result) + ")";
  // ncclGetLastError is the calling thread's last warning (WARN in NCCL's sources), which names
  // the failed step, the peer or the system call when NCCL knows them.
  const char *last = get_last_error != nullptr ? get_last_error(comm) : nullptr;
  if (last != nullptr && last[0] != '\0') description += ": " + std::string(last);
  return description;
}

const NcclApi &nccl_api() {
  const Loaded &result = loaded();
  if (result.error) throw *result.error;
  return *result.api;
}

bool nccl_available(std::string *why) {
  static const std::string problem = []() -> std::string {
    try {
      nccl_api();
    } catch (const Error &error) {
      return error.what();
    }
    std::string cuda_problem;
    if (!cuda_available(&cuda_problem)) {
      return "NCCL " + nccl_api().version_string() + " loaded, but " + cuda_problem;
    }
    return "";
  }();
  if (why != nullptr) *why = problem;
  return problem.empty();
}

}  // namespace perseus::comm::nccl

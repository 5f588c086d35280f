#include "lib/comm/pmi_library.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstring>

#include "lib/comm/error.h"

namespace perseus::comm {

namespace {

constexpr int kPmi2Success = 0;      // PMI2_SUCCESS
constexpr int kMaxValue = 1024;      // PMI2_MAX_VALLEN
constexpr int kMaxJobId = 1024;      // PMI2_MAX_VALLEN, as Slurm sizes a job id
constexpr size_t kChunkBytes = 500;  // hex: 1000 characters a value, under kMaxValue

std::string loaded_path(void *handle, const std::string &fallback) {
  link_map *map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name) {
    return map->l_name;
  }
  return fallback;
}

template <typename Function>
void bind(Function *&function, void *library, const std::string &path, const char *symbol) {
  dlerror();
  function = reinterpret_cast<Function *>(dlsym(library, symbol));
  if (!function) {
    throw Error(Code::kRendezvous, path + " has no " + symbol +
                                       ": it is not a PMI2 client library; point "
                                       "PERSEUS_PMI2_LIBRARY at Slurm's libpmi2.so.0");
  }
}

std::string chunk_key(const std::string &key, size_t chunk) {
  return key + "/" + std::to_string(chunk);
}

}  // namespace

Pmi2Library Pmi2Library::open(const std::vector<std::string> &names,
                              const std::string &why_needed) {
  std::string reasons;
  void *library = nullptr;
  std::string path;
  for (const std::string &name : names) {
    library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library) {
      path = loaded_path(library, name);
      break;
    }
    const char *error = dlerror();
    reasons += (reasons.empty() ? "" : "; ") + (error ? std::string(error) : name + ": not found");
  }
  if (!library) {
    throw Error(Code::kRendezvous,
                why_needed + ", but Slurm's PMI2 library could not be loaded (" + reasons +
                    "): install it (Debian: libpmi2-0), add its folder to LD_LIBRARY_PATH or "
                    "name the file in PERSEUS_PMI2_LIBRARY, or start the program under "
                    "perseusrun");
  }
  Api api{};
  bind(api.init, library, path, "PMI2_Init");
  bind(api.finalize, library, path, "PMI2_Finalize");
  bind(api.job_get_id, library, path, "PMI2_Job_GetId");
  bind(api.kvs_put, library, path, "PMI2_KVS_Put");
  bind(api.kvs_fence, library, path, "PMI2_KVS_Fence");
  bind(api.kvs_get, library, path, "PMI2_KVS_Get");
  return Pmi2Library(path, api);
}

void Pmi2Library::check(int rc, const char *call) const {
  if (rc == kPmi2Success) return;
  throw Error(Code::kRendezvous, std::string(call) + " failed with PMI2 error " +
                                     std::to_string(rc) + " (" + path_ +
                                     "): the step's process manager did not answer as PMI2 "
                                     "does; start the program with srun --mpi=pmi2, or under "
                                     "perseusrun");
}

void Pmi2Library::init() {
  int spawned = 0, appnum = 0;
  check(api_.init(&spawned, &size_, &rank_, &appnum), "PMI2_Init");
  if (size_ < 1 || rank_ < 0 || rank_ >= size_) {
    throw Error(Code::kRendezvous, "PMI2_Init gave rank " + std::to_string(rank_) + " of " +
                                       std::to_string(size_) + " (" + path_ + ")");
  }
  std::vector<char> id(kMaxJobId, '\0');
  check(api_.job_get_id(id.data(), kMaxJobId - 1), "PMI2_Job_GetId");
  job_id_ = id.data();
}

void Pmi2Library::put_bytes(const std::string &key, const void *bytes, size_t size) const {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto *data = static_cast<const unsigned char *>(bytes);
  for (size_t chunk = 0, at = 0; at < size || chunk == 0; ++chunk) {
    std::string value;
    for (size_t end = std::min(size, at + kChunkBytes); at < end; ++at) {
      value += kHex[data[at] >> 4];
      value += kHex[data[at] & 0xf];
    }
    check(api_.kvs_put(chunk_key(key, chunk).c_str(), value.c_str()), "PMI2_KVS_Put");
  }
}

void Pmi2Library::fence() const { check(api_.kvs_fence(), "PMI2_KVS_Fence"); }

void Pmi2Library::get_bytes(int source, const std::string &key, void *bytes, size_t size) const {
  auto *data = static_cast<unsigned char *>(bytes);
  const auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  size_t at = 0;
  for (size_t chunk = 0; at < size || chunk == 0; ++chunk) {
    char value[kMaxValue + 1] = {};
    int length = 0;
    check(api_.kvs_get(job_id_.c_str(), source, chunk_key(key, chunk).c_str(), value, kMaxValue,
                       &length),
          "PMI2_KVS_Get");
    const size_t text = strnlen(value, kMaxValue);
    bool good = text % 2 == 0 && at + text / 2 <= size && (text > 0 || size == 0);
    for (size_t i = 0; good && i < text; i += 2) {
      const int high = nibble(value[i]), low = nibble(value[i + 1]);
      good = high >= 0 && low >= 0;
      if (good) data[at++] = static_cast<unsigned char>(high << 4 | low);
    }
    if (!good) {
      throw Error(Code::kRendezvous, "task " + std::to_string(source) + "'s value " +
                                         chunk_key(key, chunk) +
                                         " in the PMI2 key-value space is not what libperseus "
                                         "put there (another program's, or a different "
                                         "libperseus version on that host)");
    }
  }
}

void Pmi2Library::finalize() const { check(api_.finalize(), "PMI2_Finalize"); }

}  // namespace perseus::comm

#include "lib/comm/pmi_library.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
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
void bind(Function *&function, void *library, const std::string &path, const char *symbol,
          const char *kind = "PMI2", const char *variable = "PERSEUS_PMI2_LIBRARY",
          const char *library_name = "Slurm's libpmi2.so.0") {
  dlerror();
  function = reinterpret_cast<Function *>(dlsym(library, symbol));
  if (!function) {
    throw Error(Code::kRendezvous, path + " has no " + symbol + ": it is not a " + kind +
                                       " client library; point " + variable + " at " +
                                       library_name);
  }
}

// The first of `names` that loads, or an Error naming each and why it failed.
void *open_first(const std::vector<std::string> &names, const std::string &why_needed,
                 const std::string &what, const std::string &package, const std::string &variable,
                 std::string &path) {
  std::string reasons;
  for (const std::string &name : names) {
    if (void *library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      path = loaded_path(library, name);
      return library;
    }
    const char *error = dlerror();
    reasons += (reasons.empty() ? "" : "; ") + (error ? std::string(error) : name + ": not found");
  }
  throw Error(Code::kRendezvous, why_needed + ", but " + what + " could not be loaded (" + reasons +
                                     "): install it (Debian: " + package +
                                     "), add its folder to LD_LIBRARY_PATH or name the file in " +
                                     variable + ", or start the program under perseusrun");
}

std::string to_hex(const void *bytes, size_t size) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto *data = static_cast<const unsigned char *>(bytes);
  std::string text;
  text.reserve(2 * size);
  for (size_t i = 0; i < size; ++i) {
    text += kHex[data[i] >> 4];
    text += kHex[data[i] & 0xf];
  }
  return text;
}

// Decodes `text` into `out` at `at`; false when it is not hex or does not fit.
bool from_hex(const char *text, size_t length, unsigned char *out, size_t &at, size_t size) {
  const auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (length % 2 != 0 || at + length / 2 > size) return false;
  for (size_t i = 0; i < length; i += 2) {
    const int high = nibble(text[i]), low = nibble(text[i + 1]);
    if (high < 0 || low < 0) return false;
    out[at++] = static_cast<unsigned char>(high << 4 | low);
  }
  return true;
}

[[noreturn]] void foreign_value(int source, const std::string &key, const char *kind) {
  throw Error(Code::kRendezvous, "task " + std::to_string(source) + "'s value " + key + " in the " +
                                     kind +
                                     " key-value space is not what libperseus put there "
                                     "(another program's, or a different libperseus version "
                                     "on that host)");
}

std::string chunk_key(const std::string &key, size_t chunk) {
  return key + "/" + std::to_string(chunk);
}

}  // namespace

Pmi2Library Pmi2Library::open(const std::vector<std::string> &names,
                              const std::string &why_needed) {
  std::string path;
  void *library = open_first(names, why_needed, "Slurm's PMI2 library", "libpmi2-0",
                             "PERSEUS_PMI2_LIBRARY", path);
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
  const auto *data = static_cast<const unsigned char *>(bytes);
  for (size_t chunk = 0, at = 0; at < size || chunk == 0; ++chunk) {
    const size_t length = std::min(size - at, kChunkBytes);
    const std::string value = to_hex(data + at, length);
    at += length;
    check(api_.kvs_put(chunk_key(key, chunk).c_str(), value.c_str()), "PMI2_KVS_Put");
  }
}

void Pmi2Library::fence() const { check(api_.kvs_fence(), "PMI2_KVS_Fence"); }

void Pmi2Library::get_bytes(int source, const std::string &key, void *bytes, size_t size) const {
  auto *data = static_cast<unsigned char *>(bytes);
  size_t at = 0;
  for (size_t chunk = 0; at < size || chunk == 0; ++chunk) {
    char value[kMaxValue + 1] = {};
    int length = 0;
    check(api_.kvs_get(job_id_.c_str(), source, chunk_key(key, chunk).c_str(), value, kMaxValue,
                       &length),
          "PMI2_KVS_Get");
    const size_t text = strnlen(value, kMaxValue);
    if ((text == 0 && size > 0) || !from_hex(value, text, data, at, size)) {
      foreign_value(source, chunk_key(key, chunk), "PMI2");
    }
  }
}

void Pmi2Library::finalize() const { check(api_.finalize(), "PMI2_Finalize"); }

namespace {

constexpr int kPmixSuccess = 0;                     // PMIX_SUCCESS
constexpr uint16_t kPmixBool = 1;                   // PMIX_BOOL
constexpr uint16_t kPmixString = 3;                 // PMIX_STRING
constexpr uint16_t kPmixUint32 = 14;                // PMIX_UINT32
constexpr uint8_t kPmixGlobal = 3;                  // PMIX_GLOBAL
constexpr uint32_t kPmixWildcard = UINT32_MAX - 1;  // PMIX_RANK_WILDCARD
static_assert(sizeof(PmixLibrary::Proc) == 260 && offsetof(PmixLibrary::Proc, rank) == 256);
static_assert(sizeof(PmixLibrary::Value) == 32 && offsetof(PmixLibrary::Value, data) == 8);
static_assert(sizeof(PmixLibrary::Info) == 552 && offsetof(PmixLibrary::Info, value) == 520);

}  // namespace

PmixLibrary PmixLibrary::open(const std::vector<std::string> &names,
                              const std::string &why_needed) {
  std::string path;
  void *library =
      open_first(names, why_needed, "the PMIx library", "libpmix2", "PERSEUS_PMIX_LIBRARY", path);
  Api api{};
  const auto bind_pmix = [&](auto &function, const char *symbol) {
    bind(function, library, path, symbol, "PMIx", "PERSEUS_PMIX_LIBRARY", "libpmix.so.2");
  };
  bind_pmix(api.init, "PMIx_Init");
  bind_pmix(api.finalize, "PMIx_Finalize");
  bind_pmix(api.put, "PMIx_Put");
  bind_pmix(api.commit, "PMIx_Commit");
  bind_pmix(api.fence, "PMIx_Fence");
  bind_pmix(api.get, "PMIx_Get");
  api.value_destruct = reinterpret_cast<void (*)(Value *)>(dlsym(library, "PMIx_Value_destruct"));
  return PmixLibrary(path, api);
}

void PmixLibrary::check(int rc, const char *call) const {
  if (rc == kPmixSuccess) return;
  throw Error(Code::kRendezvous, std::string(call) + " failed with PMIx status " +
                                     std::to_string(rc) + " (" + path_ +
                                     "): the launcher's PMIx server did not answer; start the "
                                     "program with srun --mpi=pmix, or under perseusrun");
}

void PmixLibrary::init() {
  check(api_.init(&self_, nullptr, 0), "PMIx_Init");
  Proc job = self_;
  job.rank = kPmixWildcard;
  Value *value = nullptr;
  check(api_.get(&job, "pmix.job.size", nullptr, 0, &value), "PMIx_Get(pmix.job.size)");
  if (value == nullptr || value->type != kPmixUint32) {
    throw Error(Code::kRendezvous, "PMIx_Get(pmix.job.size) gave no uint32 (" + path_ + ")");
  }
  size_ = static_cast<int>(value->data.uint32);
  release(value);
  rank_ = static_cast<int>(self_.rank);
  if (size_ < 1 || rank_ < 0 || rank_ >= size_) {
    throw Error(Code::kRendezvous, "PMIx gave rank " + std::to_string(rank_) + " of " +
                                       std::to_string(size_) + " (" + path_ + ")");
  }
}

void PmixLibrary::put_bytes(const std::string &key, const void *bytes, size_t size) const {
  std::string text = to_hex(bytes, size);
  Value value{};
  value.type = kPmixString;
  value.data.string = text.data();
  check(api_.put(kPmixGlobal, key.c_str(), &value), "PMIx_Put");
  check(api_.commit(), "PMIx_Commit");
}

void PmixLibrary::fence() const {
  Info collect{};
  std::strcpy(collect.key, "pmix.collect");  // PMIX_COLLECT_DATA
  collect.value.type = kPmixBool;
  collect.value.data.flag = true;
  check(api_.fence(nullptr, 0, &collect, 1), "PMIx_Fence");
}

void PmixLibrary::get_bytes(int source, const std::string &key, void *bytes, size_t size) const {
  Proc from = self_;
  from.rank = static_cast<uint32_t>(source);
  Value *value = nullptr;
  check(api_.get(&from, key.c_str(), nullptr, 0, &value), "PMIx_Get");
  size_t at = 0;
  const bool good = value != nullptr && value->type == kPmixString &&
                    value->data.string != nullptr &&
                    from_hex(value->data.string, strlen(value->data.string),
                             static_cast<unsigned char *>(bytes), at, size) &&
                    at == size;
  release(value);
  if (!good) foreign_value(source, key, "PMIx");
}

// What PMIX_VALUE_RELEASE does: the value's contents, then the value PMIx_Get allocated.
void PmixLibrary::release(Value *value) const {
  if (value == nullptr || api_.value_destruct == nullptr) return;
  api_.value_destruct(value);
  free(value);
}

void PmixLibrary::finalize() const { check(api_.finalize(nullptr, 0), "PMIx_Finalize"); }

}  // namespace perseus::comm

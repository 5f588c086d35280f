#include "lib/comm/nccl/shared_library.h"

#include <dlfcn.h>
#include <link.h>

namespace perseus::comm::nccl {

namespace {

std::string loaded_path(void *handle, const std::string &fallback) {
  link_map *map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return fallback;
}

}  // namespace

SharedLibrary SharedLibrary::open_first(const std::vector<std::string> &names,
                                        const std::string &what) {
  // A copy the process has already loaded (a framework's) wins over a newer one on disk: two
  // copies of the CUDA runtime or NCCL in one process work, but waste memory and start-up time.
  for (const std::string &name : names) {
    void *handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (handle != nullptr) return SharedLibrary(handle, loaded_path(handle, name), what);
  }
  std::string reasons;
  for (const std::string &name : names) {
    void *handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) return SharedLibrary(handle, loaded_path(handle, name), what);
    const char *error = dlerror();
    reasons += "\n  " + name + ": " + (error != nullptr ? error : "not found");
  }
  throw Error(Code::kInvalidArgument,
              what +
                  " could not be loaded, so this host cannot run GPU operations. Tried:" + reasons +
                  "\nInstall it, or add its folder to LD_LIBRARY_PATH, or use host memory "
                  "(PERSEUS_DEVICE_CPU)");
}

void *SharedLibrary::find(const char *symbol) const {
  void *address = find_optional(symbol);
  if (address == nullptr) {
    throw Error(Code::kInvalidArgument, what_ + " at " + path_ + " has no " + symbol +
                                            ": it is too old for libperseus; install a newer one");
  }
  return address;
}

void *SharedLibrary::find_optional(const char *symbol) const {
  dlerror();  // clears an earlier error, so that a null symbol is told from a failure
  return dlsym(handle_, symbol);
}

}  // namespace perseus::comm::nccl

#pragma once
// A shared library opened at run time (dlopen), for the CUDA runtime and NCCL: libperseus links
// neither, so that one build loads on hosts without an NVIDIA driver and asks at run time
// whether the GPU path is usable (tensorpipe's tensorpipe/common/cuda_lib.h does the same).
//
// Libraries are never closed: NCCL starts threads of its own and the CUDA runtime registers
// exit handlers, and either would be left pointing into unmapped code. A name that the process
// has already loaded (torch loads its own libnccl.so.2 and libcudart) is found by its soname and
// shared, so libperseus uses the framework's copy instead of a second one.

#include <string>
#include <vector>

#include "lib/comm/error.h"

namespace perseus::comm::nccl {

class SharedLibrary {
 public:
  // Opens the first of `names` that dlopen finds; `what` names the library in errors
  // ("the CUDA runtime"). Throws Error(kInvalidArgument) naming every name tried and why each
  // failed: the library is not installed, so no GPU operation can be asked of this host.
  static SharedLibrary open_first(const std::vector<std::string> &names, const std::string &what);

  // The function `symbol`, or an Error(kInvalidArgument) saying this library is too old for it.
  template <typename Function>
  void bind(Function *&function, const char *symbol) const {
    function = reinterpret_cast<Function *>(find(symbol));
  }
  // The function `symbol`, or nullptr (for functions that only newer versions have).
  template <typename Function>
  void bind_optional(Function *&function, const char *symbol) const {
    function = reinterpret_cast<Function *>(find_optional(symbol));
  }

  // The file that was loaded ("/usr/lib/x86_64-linux-gnu/libnccl.so.2").
  const std::string &path() const { return path_; }

 private:
  SharedLibrary(void *handle, std::string path, std::string what)
      : handle_(handle), path_(std::move(path)), what_(std::move(what)) {}
  void *find(const char *symbol) const;
  void *find_optional(const char *symbol) const;

  void *handle_;
  std::string path_;
  std::string what_;
};

}  // namespace perseus::comm::nccl

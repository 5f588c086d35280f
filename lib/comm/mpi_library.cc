#include "lib/comm/mpi_library.h"

#include <dlfcn.h>
#include <link.h>

#include "lib/comm/error.h"

namespace perseus::comm {

namespace {

constexpr int kMpiSuccess = 0;         // MPI_SUCCESS
constexpr int kMpiThreadMultiple = 3;  // MPI_THREAD_MULTIPLE in Open MPI's mpi.h

std::string loaded_path(void *handle, const std::string &fallback) {
  link_map *map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name) {
    return map->l_name;
  }
  return fallback;
}

// A symbol that must be there; an Open MPI without it is too old, or the library is not Open MPI.
void *find(void *library, const std::string &path, const char *symbol) {
  dlerror();
  void *address = dlsym(library, symbol);
  if (!address) {
    throw Error(Code::kRendezvous,
                path + " has no " + symbol +
                    ": libperseus bootstraps through Open MPI's ABI only (MPICH and its "
                    "derivatives are not supported); point PERSEUS_MPI_LIBRARY at Open MPI's "
                    "libmpi.so, or start the program under perseusrun");
  }
  return address;
}

// An Open MPI object (ompi_mpi_comm_world), as libmpi itself sees it. A program linked against
// libmpi that names MPI_COMM_WORLD has the object copied into the executable (a copy
// relocation), and libmpi then uses that copy, not its own: so the object is looked up in the
// process's global scope first (the executable comes first there), and in the library only
// when the program has no copy. The library's own one would be a never-initialised object.
void *find_object(void *library, const std::string &path, const char *symbol) {
  dlerror();
  if (void *address = dlsym(RTLD_DEFAULT, symbol)) return address;
  return find(library, path, symbol);
}

template <typename Function>
void bind(Function *&function, void *library, const std::string &path, const char *symbol) {
  function = reinterpret_cast<Function *>(find(library, path, symbol));
}

}  // namespace

MpiLibrary MpiLibrary::open(const std::vector<std::string> &names, const std::string &why_needed) {
  std::string reasons;
  void *library = nullptr;
  std::string path;
  for (const std::string &name : names) {
    // RTLD_GLOBAL: Open MPI's plugins resolve their symbols against libmpi's.
    library = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (library) {
      path = loaded_path(library, name);
      break;
    }
    const char *error = dlerror();  // names the file already
    reasons += (reasons.empty() ? "" : "; ") + (error ? std::string(error) : name + ": not found");
  }
  if (!library) {
    throw Error(Code::kRendezvous,
                why_needed + ", but Open MPI's library could not be loaded (" + reasons +
                    "): install Open MPI's library (Debian: libopenmpi3), add its folder to "
                    "LD_LIBRARY_PATH or name the file in PERSEUS_MPI_LIBRARY, or start the "
                    "program under perseusrun");
  }
  Api api{};
  bind(api.initialized, library, path, "MPI_Initialized");
  bind(api.finalized, library, path, "MPI_Finalized");
  bind(api.init_thread, library, path, "MPI_Init_thread");
  bind(api.comm_rank, library, path, "MPI_Comm_rank");
  bind(api.comm_size, library, path, "MPI_Comm_size");
  bind(api.bcast, library, path, "MPI_Bcast");
  bind(api.allgather, library, path, "MPI_Allgather");
  bind(api.finalize, library, path, "MPI_Finalize");
  // Open MPI's MPI_COMM_WORLD is &ompi_mpi_comm_world, MPI_BYTE &ompi_mpi_byte (mpi.h).
  api.comm_world = find_object(library, path, "ompi_mpi_comm_world");
  api.byte = find_object(library, path, "ompi_mpi_byte");
  return MpiLibrary(path, api);
}

void MpiLibrary::check(int rc, const char *call) const {
  if (rc != kMpiSuccess) {
    throw Error(Code::kRendezvous, std::string(call) + " failed with MPI error " +
                                       std::to_string(rc) + " (" + path_ + ")");
  }
}

bool MpiLibrary::initialized() const {
  int flag = 0;
  check(api_.initialized(&flag), "MPI_Initialized");
  return flag != 0;
}

bool MpiLibrary::finalized() const {
  int flag = 0;
  check(api_.finalized(&flag), "MPI_Finalized");
  return flag != 0;
}

void MpiLibrary::init_thread() const {
  int provided = 0;
  check(api_.init_thread(nullptr, nullptr, kMpiThreadMultiple, &provided), "MPI_Init_thread");
}

int MpiLibrary::rank() const {
  int rank = 0;
  check(api_.comm_rank(api_.comm_world, &rank), "MPI_Comm_rank(MPI_COMM_WORLD)");
  return rank;
}

int MpiLibrary::size() const {
  int size = 0;
  check(api_.comm_size(api_.comm_world, &size), "MPI_Comm_size(MPI_COMM_WORLD)");
  return size;
}

void MpiLibrary::broadcast(void *buffer, int bytes, int root) const {
  check(api_.bcast(buffer, bytes, api_.byte, root, api_.comm_world), "MPI_Bcast");
}

void MpiLibrary::allgather(const void *in, void *out, int bytes) const {
  check(api_.allgather(in, bytes, api_.byte, out, bytes, api_.byte, api_.comm_world),
        "MPI_Allgather");
}

void MpiLibrary::finalize() const { check(api_.finalize(), "MPI_Finalize"); }

}  // namespace perseus::comm

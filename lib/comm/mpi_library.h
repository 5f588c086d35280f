#pragma once
// Open MPI, loaded at run time (dlopen) for bootstrapping a job that mpirun or srun started:
// libperseus does not link MPI, so that it loads on hosts without it and never drags a second
// MPI into a framework's process.
//
// Only Open MPI's ABI is supported: there MPI_COMM_WORLD and MPI_BYTE are the addresses of the
// library's objects ompi_mpi_comm_world and ompi_mpi_byte (mpi.h, OMPI_PREDEFINED_GLOBAL),
// found here with dlsym. MPICH's handles are integer constants instead; a library without
// those objects is refused by name.
//
// The library is opened with RTLD_GLOBAL, which Open MPI needs: its plugins (mca_*.so) resolve
// their symbols against libmpi's. It is never closed (Open MPI does not support being unloaded).
//
// Threads: any thread, one call at a time (MPI_Init_thread is asked for MPI_THREAD_MULTIPLE,
// as Horovod does, in case the program uses MPI as well). Every call that returns an MPI error
// code throws Error(kRendezvous) naming the call and the code.

#include <string>
#include <utility>
#include <vector>

namespace perseus::comm {

class MpiLibrary {
 public:
  // Opens `names` in order (the first that loads wins) and binds the functions used here.
  // Throws Error(kRendezvous) with `why_needed` (how the job was started), every name tried and
  // dlerror's text, and what to do.
  static MpiLibrary open(const std::vector<std::string> &names, const std::string &why_needed);

  const std::string &path() const { return path_; }
  bool initialized() const;
  bool finalized() const;
  void init_thread() const;
  int rank() const;
  int size() const;
  // MPI_Bcast of `bytes` bytes from `root` over MPI_COMM_WORLD.
  void broadcast(void *buffer, int bytes, int root) const;
  // MPI_Allgather of `bytes` bytes per rank over MPI_COMM_WORLD; `out` holds bytes * size.
  void allgather(const void *in, void *out, int bytes) const;
  void finalize() const;

 private:
  using Handle = void *;
  struct Api {
    int (*initialized)(int *flag);
    int (*finalized)(int *flag);
    int (*init_thread)(int *argc, char ***argv, int required, int *provided);
    int (*comm_rank)(Handle comm, int *rank);
    int (*comm_size)(Handle comm, int *size);
    int (*bcast)(void *buffer, int count, Handle type, int root, Handle comm);
    int (*allgather)(const void *in, int in_count, Handle in_type, void *out, int out_count,
                     Handle out_type, Handle comm);
    int (*finalize)();
    Handle comm_world;
    Handle byte;
  };

  MpiLibrary(std::string path, const Api &api) : path_(std::move(path)), api_(api) {}
  void check(int rc, const char *call) const;

  std::string path_;
  Api api_;
};

}  // namespace perseus::comm

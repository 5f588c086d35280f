#pragma once
// Joining a job that Open MPI's mpirun or Slurm's srun started, without perseusrun: MPI stands in
// for the launcher. Rank 0 starts the job's rendezvous store (lib/rendezvous) and MPI_Bcasts
// its address, port and a fresh 256-bit secret, which so never appears in the environment, on
// a command line or in a log; every rank's place (rank, size, local and cross) comes from MPI
// and from every rank's host name, exchanged with MPI_Allgather. From there on the job runs as
// under perseusrun: through the store, then Gloo.
//
// MPI is loaded at run time (mpi_library.h) and used only here. When libperseus initialised it,
// it finalises it again at the end of the exchange, while every rank is there: mpirun fails a
// job whose rank exits, even with 0, having called MPI_Init but not MPI_Finalize, and Open MPI's
// MPI_Finalize waits for every rank, so finalising at exit would keep a failing rank waiting
// there for peers that wait for it. It also lets perseus_init work again after perseus_finalize
// (MPI cannot be initialised twice). The price: a program that uses MPI itself must initialise
// it before perseus_init (it is then used as it is, and left initialised).
//
// Threads: call from the thread that runs perseus_init, under its lock; every rank must call it
// (it is collective over MPI_COMM_WORLD).

#include <memory>

#include "lib/comm/job_environment.h"
#include "lib/rendezvous/server.h"
#include "lib/rendezvous/wire.h"

namespace perseus::comm {

struct MpiBootstrap {
  // Rank, places and the store from MPI; secret_file is empty (the secret is below); the
  // tuning variables as perseusrun's ranks read them (read_tuning).
  JobEnvironment job;
  rendezvous::Secret secret{};
  // Rank 0's store, null on the other ranks. Shared with this process's cache: it runs until the
  // process exits, so that a later perseus_init meets there again.
  std::shared_ptr<rendezvous::Server> server;
};

// True when perseusrun did not start this process (PERSEUS_RENDEZVOUS_ADDR unset) but an MPI
// launcher did: Open MPI's mpirun (OMPI_COMM_WORLD_SIZE), a PMIx launcher (PMIX_RANK: Open
// MPI 5's mpirun, srun --mpi=pmix) or Slurm's srun (SLURM_PROCID with SLURM_NTASKS).
bool started_by_mpi(Lookup lookup);

// Collective over MPI_COMM_WORLD the first time in a process; later calls (perseus_init after
// perseus_finalize) return the same place, store and secret without MPI, with the tuning
// variables read again. PERSEUS_MPI_LIBRARY names the library to load instead of libmpi.so.40
// and libmpi.so; PERSEUS_MPI_BOOTSTRAP_ADDR the address rank 0's store binds when the ranks
// span several hosts (default: the IPv4 address rank 0's host name resolves to, else its first
// non-loopback interface's; 127.0.0.1 when every rank is on one host). Throws Error(kRendezvous)
// naming what failed and what to do, Error(kInvalidArgument) for a malformed tuning variable.
MpiBootstrap bootstrap_through_mpi(Lookup lookup);

}  // namespace perseus::comm

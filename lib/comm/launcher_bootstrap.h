#pragma once
// Joining a job that Open MPI's mpirun or Slurm's srun started, without perseusrun: the
// launcher's process manager stands in for perseusrun. It offers two collectives (an allgather
// and a broadcast from rank 0): MPI's (MPI_Allgather, MPI_Bcast over MPI_COMM_WORLD) under
// mpirun, or the job step's key-value space under srun --mpi=pmi2 (PMI2) and srun --mpi=pmix
// (PMIx) (pmi_library.h: a put and a fence each), which needs no MPI at all. Rank 0 starts the
// job's rendezvous store (lib/rendezvous) and broadcasts its address, port and a fresh 256-bit
// secret, which so never appears in the environment, on a command line or in a log; every
// rank's place (rank, size, local and cross) comes from the process manager and from every
// rank's host name and machine, gathered from all. From there on the job runs as under
// perseusrun: through the store, then Gloo.
//
// MPI and PMI2 are loaded at run time (mpi_library.h, pmi_library.h) and used only here. When
// libperseus initialised MPI, it finalises it again at the end of the exchange, while every
// rank is there: mpirun fails a job whose rank exits, even with 0, having called MPI_Init but
// not MPI_Finalize, and Open MPI's MPI_Finalize waits for every rank, so finalising at exit
// would keep a failing rank waiting there for peers that wait for it. It also lets perseus_init
// work again after perseus_finalize (MPI cannot be initialised twice). The price: a program that
// uses MPI itself must initialise it before perseus_init (it is then used as it is, and left
// initialised). PMI2 is finalised at the end of the exchange alike.
//
// Threads: call from the thread that runs perseus_init, under its lock; every rank must call it
// (it is collective over every rank of the launcher's job).

#include <memory>

#include "lib/comm/job_environment.h"
#include "lib/rendezvous/server.h"
#include "lib/rendezvous/wire.h"

namespace perseus::comm {

struct LauncherBootstrap {
  // Rank, places and the store from MPI; secret_file is empty (the secret is below); the
  // tuning variables as perseusrun's ranks read them (read_tuning).
  JobEnvironment job;
  rendezvous::Secret secret{};
  // Rank 0's store, null on the other ranks. Shared with this process's cache: it runs until the
  // process exits, so that a later perseus_init meets there again.
  std::shared_ptr<rendezvous::Server> server;
};

// True when perseusrun did not start this process (PERSEUS_RENDEZVOUS_ADDR unset) but an MPI
// launcher did: Open MPI's mpirun (OMPI_COMM_WORLD_SIZE), srun --mpi=pmi2 (PMI_FD with
// PMI_RANK), a PMIx launcher (PMIX_RANK: Open MPI 5's mpirun, srun --mpi=pmix) or Slurm's srun
// (SLURM_PROCID with SLURM_NTASKS).
bool started_by_other_launcher(Lookup lookup);

// Collective over the launcher's job the first time in a process (outside mpirun: through PMI2
// when PMI_FD is set, through PMIx when PMIX_RANK is, unless PERSEUS_PMIX=0; else MPI); later
// calls (perseus_init after perseus_finalize) return the same place, store and secret without
// either, with the tuning variables read again. PERSEUS_MPI_LIBRARY names the library to load
// instead of libmpi.so.40 and libmpi.so, PERSEUS_PMI2_LIBRARY instead of libpmi2.so.0 and
// libpmi2.so, PERSEUS_PMIX_LIBRARY instead of libpmix.so.2 and libpmix.so;
// PERSEUS_MPI_BOOTSTRAP_ADDR the address rank 0's store binds when the ranks span several hosts
// (default: the IPv4 address rank 0's host name resolves to, else its first non-loopback
// interface's; 127.0.0.1 when every rank is on one host). Throws Error(kRendezvous) naming what
// failed and what to do, Error(kInvalidArgument) for a malformed tuning variable.
LauncherBootstrap bootstrap_through_launcher(Lookup lookup);

}  // namespace perseus::comm

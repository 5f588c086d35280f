/* A rank program for tests/comm/test_mpirun.py: a program that uses MPI itself and libperseus
 * beside it, under mpirun. It initialises MPI first, so libperseus must use that MPI and leave
 * it initialised; and it names MPI_COMM_WORLD, so the executable holds a copy of Open MPI's
 * ompi_mpi_comm_world (a copy relocation) that libperseus must find instead of libmpi's own.
 * Two rounds of perseus_init / allreduce / perseus_finalize, then an MPI_Allreduce and
 * MPI_Finalize. Prints "mpi program: rank R of N ok" and exits 0, or says what failed and
 * exits 1. Built by the test with mpicc (CMake builds nothing here). */
#include <mpi.h>
#include <stdio.h>

#include "perseus/perseus.h"

static int fail(int rank, const char *what, int rc) {
  fprintf(stderr, "rank %d: %s returned %d: %s\n", rank, what, rc, perseus_last_error());
  return 1;
}

int main(int argc, char **argv) {
  int provided, rank, size, round, rc;
  long value = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (round = 0; round < 2; ++round) {
    if ((rc = perseus_init()) != PERSEUS_SUCCESS) return fail(rank, "perseus_init", rc);
    if (perseus_rank() != rank || perseus_size() != size) {
      fprintf(stderr, "rank %d: perseus says rank %d of %d, MPI %d of %d\n", rank, perseus_rank(),
              perseus_size(), rank, size);
      return 1;
    }
    value = rank + 1;
    rc = perseus_allreduce(&value, &value, 1, PERSEUS_INT64, PERSEUS_SUM, "mpi program");
    if (rc != PERSEUS_SUCCESS) return fail(rank, "perseus_allreduce", rc);
    if (value != (long)size * (size + 1) / 2) {
      fprintf(stderr, "rank %d: allreduce gave %ld\n", rank, value);
      return 1;
    }
    if ((rc = perseus_finalize()) != PERSEUS_SUCCESS) return fail(rank, "perseus_finalize", rc);
  }
  /* MPI is still the program's and still usable. */
  MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (value != (long)size * size * (size + 1) / 2) {
    fprintf(stderr, "rank %d: MPI_Allreduce after libperseus gave %ld\n", rank, value);
    return 1;
  }
  MPI_Finalize();
  printf("mpi program: rank %d of %d ok\n", rank, size);
  return 0;
}

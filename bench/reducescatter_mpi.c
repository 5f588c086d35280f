/* The Open MPI peer of reducescatter_perseus.c (bench/reducescatter.py runs both): the same
 * sizes, blocks and alternation, over MPI_Reduce_scatter and MPI_Allreduce.
 *
 *   mpirun -np N reducescatter_mpi BYTES:ITERS,... PAIRS
 *
 * Rank 0 prints one JSON line per size, as reducescatter_perseus does. */
#define _POSIX_C_SOURCE 200809L

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_rank, g_size;

static void verify(const float *out, size_t count, const char *what) {
  const float expected = (float)(g_size * (g_size + 1) / 2);
  if (count && (out[0] != expected || out[count - 1] != expected)) {
    fprintf(stderr, "reducescatter_mpi: rank %d: %s: %g, expected %g\n", g_rank, what,
            (double)out[0], (double)expected);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

static double timed(int scatter, float *send, float *out, const int *counts, int total, int iters) {
  double start, elapsed, slowest = 0;
  int i;
  MPI_Barrier(MPI_COMM_WORLD);
  start = MPI_Wtime();
  for (i = 0; i < iters; i++) {
    if (scatter) {
      MPI_Reduce_scatter(send, out, counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else {
      MPI_Allreduce(send, out, total, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
  }
  elapsed = MPI_Wtime() - start;
  MPI_Allreduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest / iters * 1e6;
}

static void bench_size(size_t bytes, int iters, int pairs) {
  const int total = (int)(bytes / sizeof(float));
  int *counts = malloc((size_t)g_size * sizeof(int));
  float *send = malloc((size_t)(total ? total : 1) * sizeof(float));
  float *out = malloc((size_t)(total ? total : 1) * sizeof(float));
  double *rs = malloc((size_t)pairs * sizeof(double));
  double *ar = malloc((size_t)pairs * sizeof(double));
  int r, i, p;
  if (!counts || !send || !out || !rs || !ar) MPI_Abort(MPI_COMM_WORLD, 1);
  for (r = 0; r < g_size; r++) counts[r] = total / g_size + (r < total % g_size);
  for (i = 0; i < total; i++) send[i] = (float)(g_rank + 1);
  MPI_Reduce_scatter(send, out, counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  verify(out, (size_t)counts[g_rank], "reduce_scatter");
  MPI_Allreduce(send, out, total, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  verify(out, (size_t)total, "allreduce");
  for (p = 0; p < pairs; p++) {
    rs[p] = timed(1, send, out, counts, total, iters);
    ar[p] = timed(0, send, out, counts, total, iters);
  }
  if (g_rank == 0) {
    printf("{\"n\": %d, \"bytes\": %zu, \"iters\": %d, \"reducescatter_us\": [", g_size, bytes,
           iters);
    for (p = 0; p < pairs; p++) printf("%s%.6g", p ? ", " : "", rs[p]);
    printf("], \"allreduce_us\": [");
    for (p = 0; p < pairs; p++) printf("%s%.6g", p ? ", " : "", ar[p]);
    printf("]}\n");
    fflush(stdout);
  }
  free(counts);
  free(send);
  free(out);
  free(rs);
  free(ar);
}

int main(int argc, char **argv) {
  char *spec, *item, *save = NULL;
  int pairs;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (argc != 3 || (pairs = atoi(argv[2])) < 1) {
    if (g_rank == 0) fprintf(stderr, "usage: reducescatter_mpi BYTES:ITERS,... PAIRS\n");
    MPI_Finalize();
    return 2;
  }
  spec = strdup(argv[1]);
  for (item = strtok_r(spec, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    size_t bytes = 0;
    int iters = 0;
    if (sscanf(item, "%zu:%d", &bytes, &iters) != 2 || iters < 1) {
      if (g_rank == 0) fprintf(stderr, "reducescatter_mpi: '%s' is not BYTES:ITERS\n", item);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    bench_size(bytes, iters, pairs);
  }
  free(spec);
  MPI_Finalize();
  return 0;
}

/* CPU all-reduce benchmark, Open MPI peer (bench/cpu_allreduce.py runs it and its peers).
 *
 *   mpirun --oversubscribe -np N cpu_allreduce_mpi SIZES [MANY]
 *
 * SIZES is BYTES:ITERS,... (float32 SUM, out of place: one send and one recv buffer per rank);
 * MANY is TENSORS:BYTES:ITERS, e.g. 1000:4096:5: each iteration all-reduces TENSORS separate
 * buffers of BYTES, one MPI_Allreduce call each. Per size: a
 * warm-up (max(1, ITERS / 10) calls, the first checked), a barrier, ITERS timed calls, and the
 * largest elapsed time over the ranks (an all-reduce MAX). Rank 0 prints one JSON line per case;
 * busbw = algbw * 2 (N - 1) / N, as nccl-tests. The same program as cpu_allreduce_perseus.c,
 * over MPI_Allreduce on MPI_COMM_WORLD. C99 + MPI. */
#define _POSIX_C_SOURCE 199309L

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_rank, g_size;

static double now(void) { return MPI_Wtime(); }

static void check(int rc, const char *what) {
  if (rc != MPI_SUCCESS) {
    char message[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(rc, message, &length);
    fprintf(stderr, "cpu_allreduce_mpi: rank %d: %s failed (%d): %s\n", g_rank, what, rc, message);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

static void *alloc_floats(size_t count, float value) {
  float *p = malloc((count ? count : 1) * sizeof(float));
  size_t i;
  if (!p) {
    fprintf(stderr, "cpu_allreduce_mpi: rank %d: out of memory (%zu floats)\n", g_rank, count);
    exit(1);
  }
  for (i = 0; i < count; i++) p[i] = value;
  return p;
}

/* Every rank sends rank + 1, so every element of the sum is N (N + 1) / 2. */
static void verify(const float *recv, size_t count) {
  const float expected = (float)(g_size * (g_size + 1) / 2);
  if (count &&
      (recv[0] != expected || recv[count - 1] != expected || recv[count / 2] != expected)) {
    fprintf(stderr, "cpu_allreduce_mpi: rank %d: wrong sum %g (expected %g)\n", g_rank,
            (double)recv[0], (double)expected);
    exit(1);
  }
}

/* The largest of every rank's seconds. */
static double max_over_ranks(double seconds) {
  double result = 0;
  check(MPI_Allreduce(&seconds, &result, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "allreduce MAX");
  return result;
}

static void bench_size(size_t bytes, int iters) {
  const size_t count = bytes / sizeof(float);
  float *send = alloc_floats(count, (float)(g_rank + 1));
  float *recv = alloc_floats(count, 0.0f);
  const int warmup = iters / 10 > 1 ? iters / 10 : 1;
  double start, elapsed, algbw;
  int i;
  for (i = 0; i < warmup; i++) {
    check(MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "allreduce");
    if (i == 0) verify(recv, count);
  }
  check(MPI_Barrier(MPI_COMM_WORLD), "barrier");
  start = now();
  for (i = 0; i < iters; i++)
    check(MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "allreduce");
  elapsed = max_over_ranks(now() - start);
  verify(recv, count);
  algbw = (double)bytes * iters / elapsed / 1e9;
  if (g_rank == 0)
    printf(
        "{\"peer\": \"mpi\", \"n\": %d, \"case\": \"size\", \"bytes\": %zu, \"iters\": %d, "
        "\"seconds\": %.9g, \"us_per_call\": %.6g, \"algbw_gbs\": %.6g, \"busbw_gbs\": %.6g}\n",
        g_size, bytes, iters, elapsed, elapsed / iters * 1e6, algbw,
        algbw * 2.0 * (g_size - 1) / g_size);
  fflush(stdout);
  free(send);
  free(recv);
}

static void bench_many(int tensors, size_t bytes, int iters) {
  const size_t count = bytes / sizeof(float);
  float **send = malloc((size_t)tensors * sizeof *send);
  float **recv = malloc((size_t)tensors * sizeof *recv);
  double start, elapsed, algbw;
  int i, t;
  if (!send || !recv) exit(1);
  for (t = 0; t < tensors; t++) {
    send[t] = alloc_floats(count, (float)(g_rank + 1));
    recv[t] = alloc_floats(count, 0.0f);
  }
  for (t = 0; t < tensors; t++) /* one warm-up iteration, checked */
    check(MPI_Allreduce(send[t], recv[t], (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
          "allreduce");
  for (t = 0; t < tensors; t++) verify(recv[t], count);
  check(MPI_Barrier(MPI_COMM_WORLD), "barrier");
  start = now();
  for (i = 0; i < iters; i++)
    for (t = 0; t < tensors; t++)
      check(MPI_Allreduce(send[t], recv[t], (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
            "allreduce");
  elapsed = max_over_ranks(now() - start);
  algbw = (double)bytes * tensors * iters / elapsed / 1e9;
  if (g_rank == 0)
    printf(
        "{\"peer\": \"mpi\", \"n\": %d, \"case\": \"many\", \"tensors\": %d, \"bytes\": %zu, "
        "\"iters\": %d, \"seconds\": %.9g, \"ms_per_iter\": %.6g, \"algbw_gbs\": %.6g, "
        "\"busbw_gbs\": %.6g}\n",
        g_size, tensors, bytes, iters, elapsed, elapsed / iters * 1e3, algbw,
        algbw * 2.0 * (g_size - 1) / g_size);
  fflush(stdout);
  for (t = 0; t < tensors; t++) {
    free(send[t]);
    free(recv[t]);
  }
  free(send);
  free(recv);
}

int main(int argc, char **argv) {
  char *spec, *item, *save = NULL;
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: %s BYTES:ITERS[,BYTES:ITERS...] [TENSORS:BYTES:ITERS]\n", argv[0]);
    return 2;
  }
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  spec = argv[1];
  for (item = strtok_r(spec, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    unsigned long long bytes;
    int iters;
    if (sscanf(item, "%llu:%d", &bytes, &iters) != 2 || iters < 1) {
      fprintf(stderr, "cpu_allreduce_mpi: bad size %s\n", item);
      return 2;
    }
    bench_size((size_t)bytes, iters);
  }
  if (argc == 3) {
    int tensors, iters;
    unsigned long long bytes;
    if (sscanf(argv[2], "%d:%llu:%d", &tensors, &bytes, &iters) != 3 || tensors < 1 || iters < 1) {
      fprintf(stderr, "cpu_allreduce_mpi: bad many-tensors case %s\n", argv[2]);
      return 2;
    }
    bench_many(tensors, (size_t)bytes, iters);
  }
  MPI_Finalize();
  return 0;
}

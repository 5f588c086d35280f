/* CPU all-reduce benchmark, libperseus peer (bench/cpu_allreduce.py runs it and its peers).
 *
 *   perseusrun -np N -H localhost:N cpu_allreduce_perseus SIZES [MANY]
 *
 * SIZES is BYTES:ITERS,... (float32 SUM, out of place: one send and one recv buffer per rank);
 * MANY is TENSORS:BYTES:ITERS, e.g. 1000:4096:5: each iteration all-reduces TENSORS separate
 * buffers of BYTES, one blocking perseus_allreduce call each ("many"), then the same submitted
 * all at once with perseus_allreduce_async and waited for ("many_fused": what a training step
 * does, and what lets libperseus fuse them into few transfers). Per size: a
 * warm-up (max(1, ITERS / 10) calls, the first checked), a barrier, ITERS timed calls, and the
 * largest elapsed time over the ranks (an all-reduce MAX). Rank 0 prints one JSON line per case;
 * busbw = algbw * 2 (N - 1) / N, as nccl-tests. cpu_allreduce_mpi.c is the same program over
 * MPI_Allreduce. C99 + POSIX clock_gettime; only perseus.h from Perseus. */
#define _POSIX_C_SOURCE 199309L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "perseus/perseus.h"

static int g_rank, g_size;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void check(int rc, const char *what) {
  if (rc != PERSEUS_SUCCESS) {
    fprintf(stderr, "cpu_allreduce_perseus: rank %d: %s failed (%d): %s\n", g_rank, what, rc,
            perseus_last_error());
    exit(1);
  }
}

static void *alloc_floats(size_t count, float value) {
  float *p = malloc((count ? count : 1) * sizeof(float));
  size_t i;
  if (!p) {
    fprintf(stderr, "cpu_allreduce_perseus: rank %d: out of memory (%zu floats)\n", g_rank, count);
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
    fprintf(stderr, "cpu_allreduce_perseus: rank %d: wrong sum %g (expected %g)\n", g_rank,
            (double)recv[0], (double)expected);
    exit(1);
  }
}

/* The largest of every rank's seconds. */
static double max_over_ranks(double seconds) {
  double result = 0;
  check(perseus_allreduce(&seconds, &result, 1, PERSEUS_FLOAT64, PERSEUS_MAX, "elapsed"),
        "allreduce MAX");
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
    check(perseus_allreduce(send, recv, count, PERSEUS_FLOAT32, PERSEUS_SUM, "bench"), "allreduce");
    if (i == 0) verify(recv, count);
  }
  check(perseus_barrier(), "barrier");
  start = now();
  for (i = 0; i < iters; i++)
    check(perseus_allreduce(send, recv, count, PERSEUS_FLOAT32, PERSEUS_SUM, "bench"), "allreduce");
  elapsed = max_over_ranks(now() - start);
  verify(recv, count);
  algbw = (double)bytes * iters / elapsed / 1e9;
  if (g_rank == 0)
    printf(
        "{\"peer\": \"perseus\", \"n\": %d, \"case\": \"size\", \"bytes\": %zu, \"iters\": %d, "
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
    check(perseus_allreduce(send[t], recv[t], count, PERSEUS_FLOAT32, PERSEUS_SUM, "many"),
          "allreduce");
  for (t = 0; t < tensors; t++) verify(recv[t], count);
  check(perseus_barrier(), "barrier");
  start = now();
  for (i = 0; i < iters; i++)
    for (t = 0; t < tensors; t++)
      check(perseus_allreduce(send[t], recv[t], count, PERSEUS_FLOAT32, PERSEUS_SUM, "many"),
            "allreduce");
  elapsed = max_over_ranks(now() - start);
  algbw = (double)bytes * tensors * iters / elapsed / 1e9;
  if (g_rank == 0)
    printf(
        "{\"peer\": \"perseus\", \"n\": %d, \"case\": \"many\", \"tensors\": %d, \"bytes\": %zu, "
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

/* TENSORS named all-reduces submitted at once, then waited for, per iteration. */
static void bench_fused(int tensors, size_t bytes, int iters) {
  const size_t count = bytes / sizeof(float);
  float **send = malloc((size_t)tensors * sizeof *send);
  float **recv = malloc((size_t)tensors * sizeof *recv);
  char(*names)[32] = malloc((size_t)tensors * sizeof *names);
  perseus_request_t **requests = malloc((size_t)tensors * sizeof *requests);
  double start = 0, elapsed, algbw;
  int i, t;
  if (!send || !recv || !names || !requests) exit(1);
  for (t = 0; t < tensors; t++) {
    send[t] = alloc_floats(count, (float)(g_rank + 1));
    recv[t] = alloc_floats(count, 0.0f);
    snprintf(names[t], sizeof names[t], "fused.%d", t);
  }
  for (i = -1; i < iters; i++) { /* iteration -1: the warm-up, checked */
    if (i == 0) {
      check(perseus_barrier(), "barrier");
      start = now();
    }
    for (t = 0; t < tensors; t++)
      check(perseus_allreduce_async(send[t], recv[t], count, PERSEUS_FLOAT32, PERSEUS_SUM, 1.0, 1.0,
                                    names[t], PERSEUS_DEVICE_CPU, NULL, &requests[t]),
            "allreduce_async");
    for (t = 0; t < tensors; t++) {
      check(perseus_wait(requests[t]), "wait");
      perseus_release(requests[t]);
    }
    if (i == -1)
      for (t = 0; t < tensors; t++) verify(recv[t], count);
  }
  elapsed = max_over_ranks(now() - start);
  algbw = (double)bytes * tensors * iters / elapsed / 1e9;
  if (g_rank == 0)
    printf(
        "{\"peer\": \"perseus\", \"n\": %d, \"case\": \"many_fused\", \"tensors\": %d, "
        "\"bytes\": %zu, \"iters\": %d, \"seconds\": %.9g, \"ms_per_iter\": %.6g, "
        "\"algbw_gbs\": %.6g, \"busbw_gbs\": %.6g}\n",
        g_size, tensors, bytes, iters, elapsed, elapsed / iters * 1e3, algbw,
        algbw * 2.0 * (g_size - 1) / g_size);
  fflush(stdout);
  for (t = 0; t < tensors; t++) {
    free(send[t]);
    free(recv[t]);
  }
  free(send);
  free(recv);
  free(names);
  free(requests);
}

int main(int argc, char **argv) {
  char *spec, *item, *save = NULL;
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: %s BYTES:ITERS[,BYTES:ITERS...] [TENSORS:BYTES:ITERS]\n", argv[0]);
    return 2;
  }
  check(perseus_init(), "perseus_init");
  g_rank = perseus_rank();
  g_size = perseus_size();
  spec = argv[1];
  for (item = strtok_r(spec, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    unsigned long long bytes;
    int iters;
    if (sscanf(item, "%llu:%d", &bytes, &iters) != 2 || iters < 1) {
      fprintf(stderr, "cpu_allreduce_perseus: bad size %s\n", item);
      return 2;
    }
    bench_size((size_t)bytes, iters);
  }
  if (argc == 3) {
    int tensors, iters;
    unsigned long long bytes;
    if (sscanf(argv[2], "%d:%llu:%d", &tensors, &bytes, &iters) != 3 || tensors < 1 || iters < 1) {
      fprintf(stderr, "cpu_allreduce_perseus: bad many-tensors case %s\n", argv[2]);
      return 2;
    }
    bench_many(tensors, (size_t)bytes, iters);
    bench_fused(tensors, (size_t)bytes, iters);
  }
  check(perseus_finalize(), "perseus_finalize");
  return 0;
}

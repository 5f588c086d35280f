/* Host reduce-scatter against the all-reduce of the same input (what libperseus's reduce-scatter
 * was before it became a true one), alternated in one job (bench/reducescatter.py runs it).
 *
 *   perseusrun -np N -H localhost:N reducescatter_perseus BYTES:ITERS,... PAIRS
 *
 * For each size (BYTES of float32 input per rank, cut into N blocks whose sizes differ by up to
 * one element): a checked warm-up of each, then PAIRS times: ITERS timed reduce-scatters, then
 * ITERS timed all-reduces (each timing the largest over the ranks). Rank 0 prints one JSON line
 * per size with every pair's microseconds per call. C99 + POSIX clock_gettime; only perseus.h. */
#define _POSIX_C_SOURCE 200809L

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
    fprintf(stderr, "reducescatter_perseus: rank %d: %s failed (%d): %s\n", g_rank, what, rc,
            perseus_last_error());
    exit(1);
  }
}

static double max_over_ranks(double seconds) {
  double result = 0;
  check(perseus_allreduce(&seconds, &result, 1, PERSEUS_FLOAT64, PERSEUS_MAX, "elapsed"),
        "allreduce MAX");
  return result;
}

/* Every rank sends rank + 1: every reduced element is N (N + 1) / 2. */
static void verify(const float *out, size_t count, const char *what) {
  const float expected = (float)(g_size * (g_size + 1) / 2);
  if (count && (out[0] != expected || out[count - 1] != expected)) {
    fprintf(stderr, "reducescatter_perseus: rank %d: %s: %g, expected %g\n", g_rank, what,
            (double)out[0], (double)expected);
    exit(1);
  }
}

static void reducescatter(const float *send, float *out, const size_t *counts) {
  perseus_request_t *request = NULL;
  check(perseus_reducescatter_async(send, out, counts, PERSEUS_FLOAT32, PERSEUS_SUM, 1.0, 1.0, "rs",
                                    PERSEUS_DEVICE_CPU, NULL, &request),
        "perseus_reducescatter_async");
  check(perseus_wait(request), "perseus_wait (reducescatter)");
  perseus_release(request);
}

static double timed(int scatter, float *send, float *out, const size_t *counts, size_t total,
                    int iters) {
  double start;
  int i;
  check(perseus_barrier(), "barrier");
  start = now();
  for (i = 0; i < iters; i++) {
    if (scatter) {
      reducescatter(send, out, counts);
    } else {
      check(perseus_allreduce(send, out, total, PERSEUS_FLOAT32, PERSEUS_SUM, "ar"), "allreduce");
    }
  }
  return max_over_ranks(now() - start) / iters * 1e6;
}

static void bench_size(size_t bytes, int iters, int pairs) {
  const size_t total = bytes / sizeof(float);
  size_t counts[256], r, i;
  float *send = malloc((total ? total : 1) * sizeof(float));
  float *out = malloc((total ? total : 1) * sizeof(float));
  double *rs = malloc((size_t)pairs * sizeof(double));
  double *ar = malloc((size_t)pairs * sizeof(double));
  int p;
  if (!send || !out || !rs || !ar || g_size > 256) exit(1);
  for (r = 0; r < (size_t)g_size; r++)
    counts[r] = total / (size_t)g_size + (r < total % (size_t)g_size);
  for (i = 0; i < total; i++) send[i] = (float)(g_rank + 1);
  reducescatter(send, out, counts);
  verify(out, counts[g_rank], "reducescatter");
  check(perseus_allreduce(send, out, total, PERSEUS_FLOAT32, PERSEUS_SUM, "ar"), "allreduce");
  verify(out, total, "allreduce");
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
  free(send);
  free(out);
  free(rs);
  free(ar);
}

int main(int argc, char **argv) {
  char *spec, *item, *save = NULL;
  int pairs;
  if (argc != 3) {
    fprintf(stderr, "usage: reducescatter_perseus BYTES:ITERS,... PAIRS\n");
    return 2;
  }
  pairs = atoi(argv[2]);
  if (pairs < 1) {
    fprintf(stderr, "reducescatter_perseus: PAIRS '%s' is not a positive number\n", argv[2]);
    return 2;
  }
  check(perseus_init(), "perseus_init");
  g_rank = perseus_rank();
  g_size = perseus_size();
  spec = strdup(argv[1]);
  for (item = strtok_r(spec, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    size_t bytes = 0;
    int iters = 0;
    if (sscanf(item, "%zu:%d", &bytes, &iters) != 2 || iters < 1) {
      fprintf(stderr, "reducescatter_perseus: '%s' is not BYTES:ITERS\n", item);
      return 2;
    }
    bench_size(bytes, iters, pairs);
  }
  free(spec);
  check(perseus_finalize(), "perseus_finalize");
  return 0;
}

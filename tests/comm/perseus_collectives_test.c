/* A rank program for tests/comm/test_comm.py: every collective of libperseus's C ABI, for every
 * op x dtype x count, checked exactly against a reference each rank computes on its own.
 *
 * Run under perseusrun (perseusrun -np N -H localhost:N perseus_collectives_test). Prints
 * "collectives: N checks passed" and exits 0, or names the first mismatch (call, op, dtype,
 * count, index, expected, got) and exits 1.
 *
 * Exact comparison works for floats too because every value is a small integer: sums of at most
 * a few ranks' values in [-63, 63] and products of values in {-3 ... 3} stay below 256, which
 * even bfloat16 (8 significant bits) holds exactly. Average inputs are multiples of the number
 * of ranks, so that the mean is an integer as well.
 *
 * C99, and only perseus.h from Perseus: this is what a C user of the library sees. */
#define _POSIX_C_SOURCE 199309L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "perseus/perseus.h"

static int g_rank, g_size;
static long g_checks;

/* ---- element access: every dtype read and written as a double ---- */

static const char *const kDtypeNames[] = {"uint8",   "int8",     "int32",   "int64",
                                          "float16", "bfloat16", "float32", "float64"};
static const size_t kDtypeSizes[] = {1, 1, 4, 8, 2, 2, 4, 8};
static const char *const kOpNames[] = {"sum", "average", "min", "max", "product"};
#define NUM_DTYPES 8
#define NUM_OPS 5

/* Small integers only (|v| < 2048), which binary16 holds exactly: no rounding needed. */
static uint16_t half_from_int(int v) {
  float f = (float)v;
  uint32_t x;
  if (v == 0) return 0;
  memcpy(&x, &f, sizeof x);
  return (uint16_t)(((x >> 16) & 0x8000u) | ((((x >> 23) & 0xffu) - 127u + 15u) << 10) |
                    ((x >> 13) & 0x3ffu));
}

static double half_to_double(uint16_t h) {
  int exponent = (h >> 10) & 0x1f;
  double magnitude;
  if (exponent == 0) {
    magnitude = ldexp((double)(h & 0x3ff), -24);
  } else if (exponent == 0x1f) {
    magnitude = (h & 0x3ff) ? NAN : INFINITY;
  } else {
    magnitude = ldexp((double)((h & 0x3ff) | 0x400), exponent - 25);
  }
  return (h & 0x8000) ? -magnitude : magnitude;
}

static uint16_t bfloat16_from_int(int v) {
  float f = (float)v; /* small integers: the upper half holds them exactly */
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  return (uint16_t)(x >> 16);
}

static double bfloat16_to_double(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

static void put(void *buf, int dtype, size_t i, int v) {
  switch (dtype) {
    case PERSEUS_UINT8:
      ((uint8_t *)buf)[i] = (uint8_t)v;
      break;
    case PERSEUS_INT8:
      ((int8_t *)buf)[i] = (int8_t)v;
      break;
    case PERSEUS_INT32:
      ((int32_t *)buf)[i] = v;
      break;
    case PERSEUS_INT64:
      ((int64_t *)buf)[i] = v;
      break;
    case PERSEUS_FLOAT16:
      ((uint16_t *)buf)[i] = half_from_int(v);
      break;
    case PERSEUS_BFLOAT16:
      ((uint16_t *)buf)[i] = bfloat16_from_int(v);
      break;
    case PERSEUS_FLOAT32:
      ((float *)buf)[i] = (float)v;
      break;
    default:
      ((double *)buf)[i] = v;
      break;
  }
}

static double get(const void *buf, int dtype, size_t i) {
  switch (dtype) {
    case PERSEUS_UINT8:
      return ((const uint8_t *)buf)[i];
    case PERSEUS_INT8:
      return ((const int8_t *)buf)[i];
    case PERSEUS_INT32:
      return ((const int32_t *)buf)[i];
    case PERSEUS_INT64:
      return (double)((const int64_t *)buf)[i];
    case PERSEUS_FLOAT16:
      return half_to_double(((const uint16_t *)buf)[i]);
    case PERSEUS_BFLOAT16:
      return bfloat16_to_double(((const uint16_t *)buf)[i]);
    case PERSEUS_FLOAT32:
      return ((const float *)buf)[i];
    default:
      return ((const double *)buf)[i];
  }
}

/* ---- inputs and references ---- */

/* Rank r's element i for op: deterministic, small, negative too where the type allows. */
static int value(int r, size_t i, int dtype, int op) {
  int is_unsigned = dtype == PERSEUS_UINT8;
  unsigned mix = (unsigned)(r * 7 + (int)(i % 1000003u) * 13 + dtype * 3 + op);
  if (op == PERSEUS_PRODUCT) {
    int v = 1 + (int)(mix % 3u);
    return (!is_unsigned && mix % 4u == 0) ? -v : v;
  }
  if (op == PERSEUS_AVERAGE) { /* a multiple of the size, so the mean is exact */
    int w = (int)(mix % 8u);
    return g_size * (is_unsigned ? w : w - 4);
  }
  return is_unsigned ? (int)(mix % 31u) : (int)(mix % 31u) - 15;
}

static double reference(size_t i, int dtype, int op) {
  double result = value(0, i, dtype, op);
  int r;
  for (r = 1; r < g_size; ++r) {
    double v = value(r, i, dtype, op);
    switch (op) {
      case PERSEUS_SUM:
      case PERSEUS_AVERAGE:
        result += v;
        break;
      case PERSEUS_MIN:
        result = v < result ? v : result;
        break;
      case PERSEUS_MAX:
        result = v > result ? v : result;
        break;
      default:
        result *= v;
        break;
    }
  }
  return op == PERSEUS_AVERAGE ? result / g_size : result;
}

/* ---- checking ---- */

static void fail(const char *call, int op, int dtype, size_t count, size_t index, double expected,
                 double got) {
  fprintf(stderr,
          "MISMATCH rank %d: %s op=%s dtype=%s count=%lu index=%lu expected=%.17g got=%.17g\n",
          g_rank, call, op >= 0 ? kOpNames[op] : "-", kDtypeNames[dtype], (unsigned long)count,
          (unsigned long)index, expected, got);
  exit(1);
}

static void check_rc(int rc, const char *call) {
  if (rc != PERSEUS_SUCCESS) {
    fprintf(stderr, "rank %d: %s returned %d: %s\n", g_rank, call, rc, perseus_last_error());
    exit(1);
  }
}

static void *alloc(size_t count, int dtype) {
  /* malloc(0) may return NULL; libperseus accepts NULL with count 0, but keep it non-NULL
     anyway to test that count 0 ignores the buffers. */
  void *p = malloc(count * kDtypeSizes[dtype] + 1);
  if (!p) {
    fprintf(stderr, "rank %d: out of memory\n", g_rank);
    exit(1);
  }
  memset(p, 0xA5, count * kDtypeSizes[dtype] + 1); /* poison: a skipped write shows */
  return p;
}

static void check_allreduce(size_t count, int dtype, int op, int in_place) {
  const char *call = in_place ? "allreduce(in place)" : "allreduce";
  void *send = alloc(count, dtype);
  void *recv = in_place ? send : alloc(count, dtype);
  size_t i;
  for (i = 0; i < count; ++i) put(send, dtype, i, value(g_rank, i, dtype, op));
  check_rc(perseus_allreduce(send, recv, count, dtype, op, call), call);
  for (i = 0; i < count; ++i) {
    double expected = reference(i, dtype, op), got = get(recv, dtype, i);
    if (got != expected) fail(call, op, dtype, count, i, expected, got);
  }
  if (!in_place) { /* the input must be left alone */
    for (i = 0; i < count; ++i) {
      if (get(send, dtype, i) != value(g_rank, i, dtype, op)) {
        fail("allreduce(send changed)", op, dtype, count, i, value(g_rank, i, dtype, op),
             get(send, dtype, i));
      }
    }
    free(recv);
  }
  free(send);
  ++g_checks;
}

static void check_broadcast(size_t count, int dtype, int root) {
  void *buf = alloc(count, dtype);
  size_t i;
  for (i = 0; i < count; ++i) put(buf, dtype, i, value(g_rank, i, dtype, PERSEUS_SUM));
  check_rc(perseus_broadcast(buf, count, dtype, root, "broadcast"), "broadcast");
  for (i = 0; i < count; ++i) {
    double expected = value(root, i, dtype, PERSEUS_SUM), got = get(buf, dtype, i);
    if (got != expected) fail("broadcast", -1, dtype, count, i, expected, got);
  }
  free(buf);
  ++g_checks;
}

/* mode 0: separate buffers; 1: send == recv (input in recv's first count elements);
   2: send == recv + rank * count (MPI_IN_PLACE style). */
static void check_allgather(size_t count, int dtype, int mode) {
  static const char *const kCalls[] = {"allgather", "allgather(send == recv)",
                                       "allgather(in place)"};
  void *recv = alloc(count * (size_t)g_size, dtype);
  void *send = mode == 0 ? alloc(count, dtype) : recv;
  size_t i, offset = mode == 2 ? (size_t)g_rank * count : 0;
  int r;
  for (i = 0; i < count; ++i) put(send, dtype, offset + i, value(g_rank, i, dtype, PERSEUS_SUM));
  if (mode == 2) send = (char *)recv + offset * kDtypeSizes[dtype];
  check_rc(perseus_allgather(send, recv, count, dtype, kCalls[mode]), kCalls[mode]);
  for (r = 0; r < g_size; ++r) {
    for (i = 0; i < count; ++i) {
      double expected = value(r, i, dtype, PERSEUS_SUM);
      double got = get(recv, dtype, (size_t)r * count + i);
      if (got != expected)
        fail(kCalls[mode], -1, dtype, count, (size_t)r * count + i, expected, got);
    }
  }
  if (mode == 0) free(send);
  free(recv);
  ++g_checks;
}

static void check_all_collectives(void) {
  static const size_t kCounts[] = {0, 1, 7, 262147};
  size_t c;
  int dtype, op, root, mode;
  for (c = 0; c < sizeof kCounts / sizeof kCounts[0]; ++c) {
    for (dtype = 0; dtype < NUM_DTYPES; ++dtype) {
      for (op = 0; op < NUM_OPS; ++op) {
        check_allreduce(kCounts[c], dtype, op, 0);
        check_allreduce(kCounts[c], dtype, op, 1);
      }
      for (root = 0; root < g_size; ++root) check_broadcast(kCounts[c], dtype, root);
      for (mode = 0; mode < 3; ++mode) check_allgather(kCounts[c], dtype, mode);
      check_rc(perseus_barrier(), "barrier");
      ++g_checks;
    }
  }
}

/* ---- error paths: local checks, no communication ---- */

static void expect_error(int rc, int code, const char *needle, const char *what) {
  if (rc != code || !strstr(perseus_last_error(), needle)) {
    fprintf(stderr, "rank %d: %s: expected code %d and a message with '%s', got %d: '%s'\n", g_rank,
            what, code, needle, rc, perseus_last_error());
    exit(1);
  }
  ++g_checks;
}

static void check_errors_before_init(void) {
  float x = 1;
  expect_error(perseus_rank(), PERSEUS_ERROR_NOT_INITIALIZED, "perseus_init", "rank before init");
  expect_error(perseus_allreduce(&x, &x, 1, PERSEUS_FLOAT32, PERSEUS_SUM, "early"),
               PERSEUS_ERROR_NOT_INITIALIZED, "perseus_allreduce('early')",
               "allreduce before init");
  expect_error(perseus_barrier(), PERSEUS_ERROR_NOT_INITIALIZED, "not initialised",
               "barrier before init");
  expect_error(perseus_finalize(), PERSEUS_ERROR_NOT_INITIALIZED, "perseus_init",
               "finalize before init");
}

static void check_bad_arguments(void) {
  float x[4] = {0}, y[64] = {0};
  int bad_root = g_size + 3;
  char root_text[32];
  sprintf(root_text, "root %d", bad_root);
  expect_error(perseus_allreduce(x, y, 4, 99, PERSEUS_SUM, "t"), PERSEUS_ERROR_INVALID_ARGUMENT,
               "dtype 99", "bad dtype");
  expect_error(perseus_allreduce(x, y, 4, PERSEUS_FLOAT32, 42, "t"), PERSEUS_ERROR_INVALID_ARGUMENT,
               "op 42", "bad op");
  expect_error(perseus_allreduce(x, y, 4, PERSEUS_FLOAT32, -1, "t"), PERSEUS_ERROR_INVALID_ARGUMENT,
               "op -1", "negative op");
  expect_error(perseus_broadcast(x, 4, PERSEUS_FLOAT32, bad_root, "t"),
               PERSEUS_ERROR_INVALID_ARGUMENT, root_text, "bad root");
  expect_error(perseus_broadcast(x, 4, PERSEUS_FLOAT32, -1, "t"), PERSEUS_ERROR_INVALID_ARGUMENT,
               "root -1", "negative root");
  expect_error(perseus_allgather(x, y, 4, -7, "t"), PERSEUS_ERROR_INVALID_ARGUMENT, "dtype -7",
               "bad allgather dtype");
  expect_error(perseus_allreduce(NULL, y, 4, PERSEUS_FLOAT32, PERSEUS_SUM, "t"),
               PERSEUS_ERROR_INVALID_ARGUMENT, "send is NULL", "NULL send");
  expect_error(perseus_broadcast(NULL, 4, PERSEUS_FLOAT32, 0, "t"), PERSEUS_ERROR_INVALID_ARGUMENT,
               "buf is NULL", "NULL buf");
  expect_error(perseus_allreduce(y, y + 1, 4, PERSEUS_FLOAT32, PERSEUS_SUM, "t"),
               PERSEUS_ERROR_INVALID_ARGUMENT, "overlap", "overlapping buffers");
  /* count 0 with NULL buffers is fine (and every rank makes these calls: they are collective) */
  check_rc(perseus_allreduce(NULL, NULL, 0, PERSEUS_INT32, PERSEUS_MAX, NULL), "allreduce(0)");
  check_rc(perseus_allgather(NULL, NULL, 0, PERSEUS_INT32, NULL), "allgather(0)");
}

static void check_places(void) {
  const char *rank = getenv("PERSEUS_RANK"), *size = getenv("PERSEUS_SIZE");
  if (!rank || !size || perseus_rank() != atoi(rank) || perseus_size() != atoi(size) ||
      perseus_local_rank() < 0 || perseus_local_rank() >= perseus_local_size() ||
      perseus_cross_rank() < 0 || perseus_cross_rank() >= perseus_cross_size()) {
    fprintf(stderr, "rank %d: the rank queries disagree with the environment\n", g_rank);
    exit(1);
  }
  ++g_checks;
}

/* finalize, then init again (a second generation of rendezvous keys), then one allreduce. */
static void check_reinit(void) {
  int64_t v = g_rank + 1, expected = (int64_t)g_size * (g_size + 1) / 2;
  check_rc(perseus_finalize(), "finalize");
  check_rc(perseus_init(), "init (again)");
  check_rc(perseus_allreduce(&v, &v, 1, PERSEUS_INT64, PERSEUS_SUM, "reinit"), "allreduce");
  if (v != expected)
    fail("allreduce(after re-init)", PERSEUS_SUM, PERSEUS_INT64, 1, 0, (double)expected, (double)v);
  ++g_checks;
}

int main(void) {
  struct timespec start, end;
  clock_gettime(CLOCK_MONOTONIC, &start);
  check_errors_before_init();
  check_rc(perseus_init(), "init");
  check_rc(perseus_init(), "init (twice)");
  g_rank = perseus_rank();
  g_size = perseus_size();
  check_places();
  check_bad_arguments();
  check_all_collectives();
  check_reinit();
  check_rc(perseus_finalize(), "finalize");
  clock_gettime(CLOCK_MONOTONIC, &end);
  printf("collectives: %ld checks passed (rank %d of %d, %.2f s)\n", g_checks, g_rank, g_size,
         (double)(end.tv_sec - start.tv_sec) + (double)(end.tv_nsec - start.tv_nsec) / 1e9);
  return 0;
}

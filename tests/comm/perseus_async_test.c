/* A rank program for tests/comm/test_async.py: libperseus's asynchronous named operations, every
 * op x dtype x size, checked exactly against a reference each rank computes on its own.
 *
 *   perseus_async_test [matrix [ROUNDS]]
 *                                 the full matrix (below), ROUNDS times (default 2); prints
 *                                 "ok" and exits 0, or prints what differed and exits 1
 *   perseus_async_test mismatch   rank r submits 'mismatched' with 10 + r elements: every rank
 *                                 must get PERSEUS_ERROR_INVALID_ARGUMENT naming both counts;
 *                                 a later allreduce must still work
 *   perseus_async_test join       rank 0 runs 3 allreduces, the others 5, then all join: the
 *                                 late allreduces sum without rank 0; last_rank is printed
 *   perseus_async_test timeline   a few named allreduces (for PERSEUS_TIMELINE)
 *   perseus_async_test nullzero   count-0 all-reduces with NULL buffers fused with others
 *   perseus_async_test many       groups through perseus_comm_allreduce_many_async on even ranks
 *                                 and a call a tensor on odd ones (run_many says what is checked)
 *
 * The matrix, for every dtype and count 0, 1, 1001 and about 2 MiB: allreduce with each op
 * (sum, average, min, max, product; in place and not; prescale/postscale), broadcast from each
 * root, allgatherv with different counts per rank, alltoall with uneven send counts,
 * reducescatter with uneven recv counts. Each batch is submitted at once, in a random order per
 * rank (seeded by the rank), and waited for in another random order; the same names are used
 * again in each round (the negotiation's cached path) with other values (the 2 MiB batches run
 * in the first round only); unnamed operations and the blocking functions come in between.
 *
 * Exact comparison works for floats too because every value is a small integer: every sum,
 * product, scaled value and mean stays below 128 in magnitude, which int8 and bfloat16 hold
 * exactly. Average inputs are multiples of the number of ranks, so the mean is an integer.
 *
 * C99, and only perseus.h from Perseus. */
#define _POSIX_C_SOURCE 199309L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perseus/perseus.h"

static unsigned g_iterations = 2;
#define NUM_DTYPES 8
#define MAX_FAILURES 20

static int g_rank, g_size, g_failures;
static long g_checks;

static const char *const kDtypeNames[] = {"uint8",   "int8",     "int32",   "int64",
                                          "float16", "bfloat16", "float32", "float64"};
static const size_t kDtypeSizes[] = {1, 1, 4, 8, 2, 2, 4, 8};
static const char *const kOpNames[] = {"sum", "average", "min", "max", "product"};

/* ---- a deterministic random generator (xorshift), seeded per rank ---- */

static uint64_t g_random;

static uint64_t next_random(void) {
  g_random ^= g_random << 13;
  g_random ^= g_random >> 7;
  g_random ^= g_random << 17;
  return g_random;
}

static void shuffle(size_t *order, size_t n) {
  size_t i;
  for (i = 0; i < n; ++i) order[i] = i;
  for (i = n; i > 1; --i) {
    size_t j = (size_t)(next_random() % i), t = order[i - 1];
    order[i - 1] = order[j];
    order[j] = t;
  }
}

/* ---- element access: every dtype read and written as a double (small integers only) ---- */

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
  float f = (float)v;
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
      ((int32_t *)buf)[i] = (int32_t)v;
      break;
    case PERSEUS_INT64:
      ((int64_t *)buf)[i] = (int64_t)v;
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
      ((double *)buf)[i] = (double)v;
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

static int is_integer(int dtype) { return dtype <= PERSEUS_INT64; }

/* ---- inputs: rank r's element i of tensor `salt`, by the op it feeds ---- */

static int input(int op, int dtype, int rank, size_t i, unsigned salt) {
  unsigned h = (unsigned)rank * 7u + (unsigned)(i % 100003u) * 13u + salt * 5u;
  int unsigned_type = dtype == PERSEUS_UINT8;
  switch (op) {
    case PERSEUS_AVERAGE: /* a multiple of the size: the mean is an integer */
      return g_size * (unsigned_type ? (int)(h % 3u) : (int)(h % 5u) - 2);
    case PERSEUS_PRODUCT: {
      static const int kSigned[] = {-2, -1, 1, 2};
      return unsigned_type ? (int)(h % 2u) + 1 : kSigned[h % 4u];
    }
    default:
      return unsigned_type ? (int)(h % 9u) : (int)(h % 9u) - 4;
  }
}

/* postscale * op over ranks of (prescale * input): every term is an integer. */
static double reduced(int op, int dtype, size_t i, unsigned salt, double pre, double post) {
  double acc = 0;
  int r;
  for (r = 0; r < g_size; ++r) {
    double x = pre * input(op, dtype, r, i, salt);
    if (r == 0) {
      acc = x;
    } else if (op == PERSEUS_SUM || op == PERSEUS_AVERAGE) {
      acc += x;
    } else if (op == PERSEUS_MIN) {
      acc = x < acc ? x : acc;
    } else if (op == PERSEUS_MAX) {
      acc = x > acc ? x : acc;
    } else {
      acc *= x;
    }
  }
  if (op == PERSEUS_AVERAGE) acc = is_integer(dtype) ? trunc(acc / g_size) : acc / g_size;
  return acc * post;
}

static void fill(void *buf, int op, int dtype, int rank, size_t offset, size_t n, unsigned salt) {
  size_t i;
  for (i = 0; i < n; ++i) put(buf, dtype, i, input(op, dtype, rank, offset + i, salt));
}

/* ---- failures ---- */

static void report(const char *what, const char *name, size_t index, double expected, double got) {
  ++g_failures;
  if (g_failures <= MAX_FAILURES) {
    printf("rank %d: %s '%s': element %zu: expected %g, got %g\n", g_rank, what, name, index,
           expected, got);
  }
}

static void fail_call(const char *call, const char *name, int rc) {
  ++g_failures;
  if (g_failures <= MAX_FAILURES) {
    printf("rank %d: %s '%s' returned %d: %s\n", g_rank, call, name ? name : "(null)", rc,
           perseus_last_error());
  }
}

/* ---- one operation of a batch ---- */

enum { ALLREDUCE, BROADCAST, ALLGATHERV, ALLTOALL, REDUCESCATTER };

typedef struct {
  int kind, dtype, op, root, in_place;
  double pre, post;
  size_t count; /* the batch's size */
  unsigned salt;
  char name[96];
  void *send, *recv;
  size_t counts[16];
  perseus_request_t *request;
} Job;

/* Allgatherv: rank r's count (rank 1 sends nothing when there is more than one element). */
static size_t gather_count(size_t s, int r) {
  if (s == 0 || (r == 1 && s > 1)) return 0;
  return s + (size_t)r * 3;
}

/* Alltoall: elements from rank `from` to rank `to`. */
static size_t a2a_count(size_t s, int from, int to) {
  if (s == 0) return 0;
  if (s == 1) return (size_t)((from + to) % 2);
  return s / (size_t)g_size + (size_t)((from * 5 + to * 3) % 4);
}

/* Reducescatter: rank r's block. */
static size_t scatter_count(size_t s, int r) {
  if (s == 0) return 0;
  if (s == 1) return (size_t)(r % 2);
  return s / (size_t)g_size + (size_t)r * 2;
}

static void *alloc(size_t n, int dtype) {
  void *p = malloc(n * kDtypeSizes[dtype] + 1);
  if (!p) {
    fprintf(stderr, "rank %d: out of memory\n", g_rank);
    exit(2);
  }
  return p;
}

/* Tensor identity for input(): a different sequence per job and round. */
static unsigned salt_of(const Job *j, unsigned round) {
  return round * 31u + (unsigned)j->kind * 7u + (unsigned)j->op * 3u + (unsigned)j->root +
         (unsigned)j->dtype;
}

static void prepare(Job *j) {
  size_t n = j->count, total = 0;
  int r;
  /* count 0: NULL buffers are allowed */
  j->send = j->recv = NULL;
  switch (j->kind) {
    case ALLREDUCE:
      /* count 0: real (empty) buffers here; NULL ones with fusion are the nullzero mode's */
      j->send = alloc(n, j->dtype);
      fill(j->send, j->op, j->dtype, g_rank, 0, n, j->salt);
      j->recv = j->in_place ? j->send : alloc(n, j->dtype);
      break;
    case BROADCAST:
      if (n) {
        j->send = j->recv = alloc(n, j->dtype);
        fill(j->send, PERSEUS_SUM, j->dtype, g_rank, 0, n, j->salt);
      }
      break;
    case ALLGATHERV:
      total = gather_count(n, g_rank);
      if (total) {
        j->send = alloc(total, j->dtype);
        fill(j->send, PERSEUS_SUM, j->dtype, g_rank, 0, total, j->salt);
      }
      break;
    case ALLTOALL:
      for (r = 0; r < g_size; ++r) {
        j->counts[r] = a2a_count(n, g_rank, r);
        total += j->counts[r];
      }
      if (total) {
        size_t offset = 0;
        j->send = alloc(total, j->dtype);
        for (r = 0; r < g_size; ++r) {
          /* the block for rank r: element i is input(rank, r * 1000 + i) */
          size_t i;
          for (i = 0; i < j->counts[r]; ++i) {
            put(j->send, j->dtype, offset + i,
                input(PERSEUS_SUM, j->dtype, g_rank, (size_t)r * 1000 + i, j->salt));
          }
          offset += j->counts[r];
        }
      }
      break;
    default: /* REDUCESCATTER */
      for (r = 0; r < g_size; ++r) {
        j->counts[r] = scatter_count(n, r);
        total += j->counts[r];
      }
      if (total) {
        j->send = alloc(total, j->dtype);
        fill(j->send, j->op, j->dtype, g_rank, 0, total, j->salt);
      }
      if (j->counts[g_rank]) j->recv = alloc(j->counts[g_rank], j->dtype);
      break;
  }
}

static int submit(Job *j) {
  const char *name = j->name[0] ? j->name : NULL;
  int rc;
  j->request = NULL;
  switch (j->kind) {
    case ALLREDUCE:
      rc = perseus_allreduce_async(j->send, j->recv, j->count, j->dtype, j->op, j->pre, j->post,
                                   name, PERSEUS_DEVICE_CPU, NULL, &j->request);
      break;
    case BROADCAST:
      rc = perseus_broadcast_async(j->send, j->count, j->dtype, j->root, name, PERSEUS_DEVICE_CPU,
                                   NULL, &j->request);
      break;
    case ALLGATHERV:
      rc = perseus_allgatherv_async(j->send, gather_count(j->count, g_rank), j->dtype, name,
                                    PERSEUS_DEVICE_CPU, NULL, &j->request);
      break;
    case ALLTOALL:
      rc = perseus_alltoall_async(j->send, j->counts, j->dtype, name, PERSEUS_DEVICE_CPU, NULL,
                                  &j->request);
      break;
    default:
      rc = perseus_reducescatter_async(j->send, j->recv, j->counts, j->dtype, j->op, j->pre,
                                       j->post, name, PERSEUS_DEVICE_CPU, NULL, &j->request);
      break;
  }
  if (rc != PERSEUS_SUCCESS) fail_call("submit", j->name, rc);
  return rc;
}

static void check_output(Job *j, const size_t *expect_counts) {
  size_t counts[16], total = 0, i, offset = 0;
  void *out;
  int r, rc = perseus_output_counts(j->request, counts);
  if (rc != PERSEUS_SUCCESS) {
    fail_call("perseus_output_counts", j->name, rc);
    return;
  }
  for (r = 0; r < g_size; ++r) {
    if (counts[r] != expect_counts[r]) {
      report("output count from rank", j->name, (size_t)r, (double)expect_counts[r],
             (double)counts[r]);
      return;
    }
    total += counts[r];
  }
  out = total ? alloc(total, j->dtype) : NULL;
  rc = perseus_output_copy(j->request, out);
  if (rc != PERSEUS_SUCCESS) {
    fail_call("perseus_output_copy", j->name, rc);
    free(out);
    return;
  }
  for (r = 0; r < g_size; ++r) {
    for (i = 0; i < counts[r]; ++i) {
      size_t index = j->kind == ALLGATHERV ? i : (size_t)g_rank * 1000 + i;
      double want = input(PERSEUS_SUM, j->dtype, r, index, j->salt);
      double got = get(out, j->dtype, offset + i);
      ++g_checks;
      if (got != want) {
        report(j->kind == ALLGATHERV ? "allgatherv" : "alltoall", j->name, offset + i, want, got);
        free(out);
        return;
      }
    }
    offset += counts[r];
  }
  free(out);
}

static void check(Job *j) {
  size_t i, n = j->count, offset = 0;
  size_t expect[16];
  int r;
  switch (j->kind) {
    case ALLREDUCE:
      for (i = 0; i < n; ++i) {
        double want = reduced(j->op, j->dtype, i, j->salt, j->pre, j->post);
        double got = get(j->recv, j->dtype, i);
        ++g_checks;
        if (got != want) {
          report("allreduce", j->name, i, want, got);
          return;
        }
      }
      break;
    case BROADCAST:
      for (i = 0; i < n; ++i) {
        double want = input(PERSEUS_SUM, j->dtype, j->root, i, j->salt);
        double got = get(j->recv, j->dtype, i);
        ++g_checks;
        if (got != want) {
          report("broadcast", j->name, i, want, got);
          return;
        }
      }
      break;
    case ALLGATHERV:
      for (r = 0; r < g_size; ++r) expect[r] = gather_count(n, r);
      check_output(j, expect);
      break;
    case ALLTOALL:
      for (r = 0; r < g_size; ++r) expect[r] = a2a_count(n, r, g_rank);
      check_output(j, expect);
      break;
    default:
      for (r = 0; r < g_rank; ++r) offset += j->counts[r];
      for (i = 0; i < j->counts[g_rank]; ++i) {
        double want = reduced(j->op, j->dtype, offset + i, j->salt, j->pre, j->post);
        double got = get(j->recv, j->dtype, i);
        ++g_checks;
        if (got != want) {
          report("reducescatter", j->name, i, want, got);
          return;
        }
      }
      break;
  }
}

static void release(Job *j) {
  perseus_release(j->request);
  j->request = NULL;
  if (j->recv && j->recv != j->send) free(j->recv);
  free(j->send);
  j->send = j->recv = NULL;
}

/* Submits every job in a random order, then waits in another. */
static void run_batch(Job *jobs, size_t n, unsigned round) {
  size_t *order = malloc((n ? n : 1) * sizeof *order);
  size_t k;
  int rc;
  for (k = 0; k < n; ++k) {
    jobs[k].salt = salt_of(&jobs[k], round);
    prepare(&jobs[k]);
  }
  shuffle(order, n);
  for (k = 0; k < n; ++k) submit(&jobs[order[k]]);
  shuffle(order, n);
  for (k = 0; k < n; ++k) {
    Job *j = &jobs[order[k]];
    if (!j->request) continue;
    rc = perseus_wait(j->request);
    if (rc != PERSEUS_SUCCESS) {
      fail_call("perseus_wait", j->name, rc);
    } else if (perseus_poll(j->request) != 1) {
      fail_call("perseus_poll after wait", j->name, perseus_poll(j->request));
    } else {
      check(j);
    }
  }
  for (k = 0; k < n; ++k) release(&jobs[k]);
  free(order);
}

/* ---- the batches ---- */

typedef struct {
  int op;
  double pre, post;
} Variant;

static const Variant kVariants[] = {
    {PERSEUS_SUM, 1, 1},     {PERSEUS_AVERAGE, 1, 1}, {PERSEUS_MIN, 1, 1},    {PERSEUS_MAX, 1, 1},
    {PERSEUS_PRODUCT, 1, 1}, {PERSEUS_SUM, 2, 0.5},   {PERSEUS_AVERAGE, 3, 2}};
#define NUM_VARIANTS (sizeof kVariants / sizeof kVariants[0])

static size_t add_jobs(Job *jobs, int dtype, size_t count) {
  size_t n = 0, v;
  int root;
  for (v = 0; v < NUM_VARIANTS; ++v) {
    const Variant *var = &kVariants[v];
    Job *j = &jobs[n++];
    memset(j, 0, sizeof *j);
    j->kind = ALLREDUCE;
    j->dtype = dtype;
    j->op = var->op;
    j->pre = var->pre;
    j->post = var->post;
    j->count = count;
    j->in_place = (int)(v % 2);
    snprintf(j->name, sizeof j->name, "allreduce.%s.%s.x%g.x%g.%zu", kDtypeNames[dtype],
             kOpNames[var->op], var->pre, var->post, count);
    j = &jobs[n++];
    *j = jobs[n - 2];
    j->kind = REDUCESCATTER;
    j->in_place = 0;
    snprintf(j->name, sizeof j->name, "reducescatter.%s.%s.x%g.x%g.%zu", kDtypeNames[dtype],
             kOpNames[var->op], var->pre, var->post, count);
  }
  for (root = 0; root < g_size; ++root) {
    Job *j = &jobs[n++];
    memset(j, 0, sizeof *j);
    j->kind = BROADCAST;
    j->dtype = dtype;
    j->root = root;
    j->count = count;
    snprintf(j->name, sizeof j->name, "broadcast.%s.root%d.%zu", kDtypeNames[dtype], root, count);
  }
  {
    Job *j = &jobs[n++];
    memset(j, 0, sizeof *j);
    j->kind = ALLGATHERV;
    j->dtype = dtype;
    j->count = count;
    snprintf(j->name, sizeof j->name, "allgatherv.%s.%zu", kDtypeNames[dtype], count);
    j = &jobs[n++];
    memset(j, 0, sizeof *j);
    j->kind = ALLTOALL;
    j->dtype = dtype;
    j->count = count;
    snprintf(j->name, sizeof j->name, "alltoall.%s.%zu", kDtypeNames[dtype], count);
  }
  return n;
}

/* Unnamed operations: the same order on every rank (their names count per process). */
static void run_unnamed(unsigned round) {
  Job jobs[6];
  size_t k;
  for (k = 0; k < 6; ++k) {
    memset(&jobs[k], 0, sizeof jobs[k]);
    jobs[k].kind = k < 4 ? ALLREDUCE : (k == 4 ? BROADCAST : ALLGATHERV);
    jobs[k].dtype = (int)(k * 3 % NUM_DTYPES);
    jobs[k].op = PERSEUS_SUM;
    jobs[k].pre = jobs[k].post = 1;
    jobs[k].root = g_size - 1;
    jobs[k].count = 17 + k;
    jobs[k].salt = round * 11u + (unsigned)k;
    prepare(&jobs[k]);
    submit(&jobs[k]); /* name "" -> NULL */
  }
  for (k = 6; k-- > 0;) {
    int rc = perseus_wait(jobs[k].request);
    if (rc != PERSEUS_SUCCESS) {
      fail_call("perseus_wait (unnamed)", "", rc);
    } else {
      check(&jobs[k]);
    }
    release(&jobs[k]);
  }
}

/* The blocking functions, named and unnamed. */
static void run_blocking(unsigned round) {
  static const size_t kCounts[] = {0, 1, 1001};
  int dtype;
  size_t c;
  char name[64];
  for (dtype = 0; dtype < NUM_DTYPES; ++dtype) {
    for (c = 0; c < 3; ++c) {
      size_t n = kCounts[c], i;
      unsigned salt = round * 13u + (unsigned)dtype;
      void *a = alloc(n + 1, dtype), *b = alloc(n * (size_t)g_size + 1, dtype);
      const char *nm = (c == 1) ? NULL : name;
      int rc;
      /* allreduce, out of place */
      snprintf(name, sizeof name, "blocking.allreduce.%s.%zu", kDtypeNames[dtype], n);
      fill(a, PERSEUS_MAX, dtype, g_rank, 0, n, salt);
      rc = perseus_allreduce(a, b, n, dtype, PERSEUS_MAX, nm);
      if (rc) fail_call("perseus_allreduce", nm, rc);
      for (i = 0; i < n && !rc; ++i) {
        double want = reduced(PERSEUS_MAX, dtype, i, salt, 1, 1);
        ++g_checks;
        if (get(b, dtype, i) != want) {
          report("blocking allreduce", name, i, want, get(b, dtype, i));
          break;
        }
      }
      /* allreduce, in place */
      fill(a, PERSEUS_SUM, dtype, g_rank, 0, n, salt);
      rc = perseus_allreduce(a, a, n, dtype, PERSEUS_SUM, nm);
      if (rc) fail_call("perseus_allreduce (in place)", nm, rc);
      for (i = 0; i < n && !rc; ++i) {
        double want = reduced(PERSEUS_SUM, dtype, i, salt, 1, 1);
        ++g_checks;
        if (get(a, dtype, i) != want) {
          report("blocking allreduce in place", name, i, want, get(a, dtype, i));
          break;
        }
      }
      /* broadcast from the last rank */
      snprintf(name, sizeof name, "blocking.broadcast.%s.%zu", kDtypeNames[dtype], n);
      fill(a, PERSEUS_SUM, dtype, g_rank, 0, n, salt + 1);
      rc = perseus_broadcast(a, n, dtype, g_size - 1, nm);
      if (rc) fail_call("perseus_broadcast", nm, rc);
      for (i = 0; i < n && !rc; ++i) {
        double want = input(PERSEUS_SUM, dtype, g_size - 1, i, salt + 1);
        ++g_checks;
        if (get(a, dtype, i) != want) {
          report("blocking broadcast", name, i, want, get(a, dtype, i));
          break;
        }
      }
      /* allgather, input already in place (recv + rank * count) */
      snprintf(name, sizeof name, "blocking.allgather.%s.%zu", kDtypeNames[dtype], n);
      fill((char *)b + (size_t)g_rank * n * kDtypeSizes[dtype], PERSEUS_SUM, dtype, g_rank, 0, n,
           salt + 2);
      rc = perseus_allgather((char *)b + (size_t)g_rank * n * kDtypeSizes[dtype], b, n, dtype, nm);
      if (rc) fail_call("perseus_allgather", nm, rc);
      for (i = 0; i < n * (size_t)g_size && !rc; ++i) {
        double want = input(PERSEUS_SUM, dtype, (int)(i / n), i % n, salt + 2);
        ++g_checks;
        if (get(b, dtype, i) != want) {
          report("blocking allgather", name, i, want, get(b, dtype, i));
          break;
        }
      }
      free(a);
      free(b);
    }
  }
  {
    int rc = perseus_barrier();
    if (rc) fail_call("perseus_barrier", NULL, rc);
  }
}

static int run_matrix(void) {
  static const size_t kSmall[] = {0, 1, 1001};
  size_t per_batch = 2 * NUM_VARIANTS + (size_t)g_size + 2;
  Job *jobs = malloc(per_batch * NUM_DTYPES * 3 * sizeof *jobs);
  unsigned round;
  int dtype;
  size_t s, n;
  if (!jobs) return 2;
  for (round = 0; round < g_iterations; ++round) {
    /* The small sizes: every dtype and op at once, several hundred operations in flight. */
    n = 0;
    for (s = 0; s < 3; ++s) {
      for (dtype = 0; dtype < NUM_DTYPES; ++dtype) n += add_jobs(jobs + n, dtype, kSmall[s]);
    }
    run_batch(jobs, n, round);
    run_unnamed(round);
    /* About 2 MiB per tensor, one dtype at a time; in the first round only (checking them
     * takes most of the time). */
    for (dtype = 0; round == 0 && dtype < NUM_DTYPES; ++dtype) {
      size_t big = (size_t)(2u << 20) / kDtypeSizes[dtype] + 1;
      n = add_jobs(jobs, dtype, big);
      run_batch(jobs, n, round);
    }
    run_blocking(round);
  }
  free(jobs);
  return 0;
}

/* ---- the scenarios of test_async.py ---- */

static int run_mismatch(void) {
  float data[64];
  size_t i, count = 10 + (size_t)g_rank;
  perseus_request_t *request = NULL;
  int rc;
  for (i = 0; i < 64; ++i) data[i] = 1.0f;
  rc = perseus_allreduce_async(data, data, count, PERSEUS_FLOAT32, PERSEUS_SUM, 1.0, 1.0,
                               "mismatched", PERSEUS_DEVICE_CPU, NULL, &request);
  if (rc != PERSEUS_SUCCESS) {
    fail_call("perseus_allreduce_async", "mismatched", rc);
    return 1;
  }
  rc = perseus_wait(request);
  printf("mismatch: wait returned %d: %s\n", rc, perseus_last_error());
  perseus_release(request);
  /* The job goes on. */
  rc = perseus_allreduce(data, data, 64, PERSEUS_FLOAT32, PERSEUS_SUM, "after");
  if (rc != PERSEUS_SUCCESS) {
    fail_call("perseus_allreduce", "after", rc);
    return 1;
  }
  for (i = 0; i < 64; ++i) {
    if (data[i] != (float)g_size) {
      report("allreduce after the mismatch", "after", i, g_size, data[i]);
      return 1;
    }
  }
  printf("after: ok\n");
  return 0;
}

static int run_join(void) {
  int steps = g_rank == 0 ? 3 : 5, step, last = -1, rc;
  int32_t data[100];
  size_t i;
  for (step = 0; step < steps; ++step) {
    char name[32];
    int32_t want = 0;
    int r;
    for (i = 0; i < 100; ++i) data[i] = (int32_t)((g_rank + 1) * 100 + step);
    for (r = 0; r < g_size; ++r) {
      if (r != 0 || step < 3) want += (int32_t)((r + 1) * 100 + step);
    }
    snprintf(name, sizeof name, "step.%d", step);
    rc = perseus_allreduce(data, data, 100, PERSEUS_INT32, PERSEUS_SUM, name);
    if (rc != PERSEUS_SUCCESS) {
      fail_call("perseus_allreduce", name, rc);
      return 1;
    }
    for (i = 0; i < 100; ++i) {
      if (data[i] != want) {
        report("allreduce while joined", name, i, want, data[i]);
        return 1;
      }
    }
  }
  rc = perseus_join(PERSEUS_DEVICE_CPU, &last);
  if (rc != PERSEUS_SUCCESS) {
    fail_call("perseus_join", NULL, rc);
    return 1;
  }
  printf("join: last_rank=%d\n", last);
  return 0;
}

/* Count 0 with NULL buffers (which perseus.h allows) in the same cycle as a non-empty
 * all-reduce of the same dtype and op, so that the two are fused; many times, so that at least
 * some pairs land in one cycle. */
static int run_nullzero(void) {
  int k, i, rc;
  for (k = 0; k < 20; ++k) {
    float data[5];
    perseus_request_t *empty = NULL, *full = NULL;
    char empty_name[32], full_name[32];
    snprintf(empty_name, sizeof empty_name, "empty.%d", k);
    snprintf(full_name, sizeof full_name, "full.%d", k);
    for (i = 0; i < 5; ++i) data[i] = (float)(g_rank + i);
    rc = perseus_allreduce_async(NULL, NULL, 0, PERSEUS_FLOAT32, PERSEUS_SUM, 1.0, 1.0, empty_name,
                                 PERSEUS_DEVICE_CPU, NULL, &empty);
    if (rc) fail_call("perseus_allreduce_async", empty_name, rc);
    rc = perseus_allreduce_async(data, data, 5, PERSEUS_FLOAT32, PERSEUS_SUM, 1.0, 1.0, full_name,
                                 PERSEUS_DEVICE_CPU, NULL, &full);
    if (rc) fail_call("perseus_allreduce_async", full_name, rc);
    if (empty && (rc = perseus_wait(empty)) != PERSEUS_SUCCESS) {
      fail_call("perseus_wait", empty_name, rc);
    }
    if (full && (rc = perseus_wait(full)) != PERSEUS_SUCCESS) {
      fail_call("perseus_wait", full_name, rc);
    } else {
      for (i = 0; i < 5; ++i) {
        double want = (double)(g_size * (g_size - 1) / 2 + g_size * i);
        ++g_checks;
        if (data[i] != want) report("allreduce", full_name, (size_t)i, want, data[i]);
      }
    }
    perseus_release(empty);
    perseus_release(full);
  }
  return g_failures ? 1 : 0;
}

static int run_timeline(void) {
  float data[1000] = {0};
  perseus_request_t *requests[3];
  static const char *const kNames[] = {"timeline.alpha", "timeline.beta", "timeline.gamma"};
  int k, round, rc;
  for (round = 0; round < 2; ++round) {
    for (k = 0; k < 3; ++k) {
      rc =
          perseus_allreduce_async(data + k * 300, data + k * 300, 300, PERSEUS_FLOAT32, PERSEUS_SUM,
                                  1.0, 1.0, kNames[k], PERSEUS_DEVICE_CPU, NULL, &requests[k]);
      if (rc) {
        fail_call("perseus_allreduce_async", kNames[k], rc);
        return 1;
      }
    }
    for (k = 0; k < 3; ++k) {
      rc = perseus_wait(requests[k]);
      if (rc) fail_call("perseus_wait", kNames[k], rc);
      perseus_release(requests[k]);
    }
  }
  return g_failures ? 1 : 0;
}

/* ---- perseus_comm_allreduce_many_async ---- */

enum { kManyTensors = 5 };
static const int kManyDtypes[kManyTensors] = {PERSEUS_FLOAT32, PERSEUS_INT32, PERSEUS_FLOAT64,
                                              PERSEUS_FLOAT32, PERSEUS_BFLOAT16};
static const size_t kManyCounts[kManyTensors] = {1, 6, 1001, 0, 7};
static const int kManyNdims[kManyTensors] = {1, 2, 3, 2, 1};

/* One group (names prefix.0 ...), submitted together on even ranks and a tensor at a time on
 * odd ones; tensor 2's shape is [7, 11, 13], or [11, 7, 13] on the last rank when `skewed`.
 * Returns the call's code; requests[] as the call leaves them. */
static int submit_many(const char *prefix, int skewed, void **bufs, const int *dtypes,
                       perseus_request_t **requests) {
  perseus_comm_t *world = NULL;
  int64_t dims[] = {1, 2, 3, 7, 11, 13, 0, 4, 7};
  char names[kManyTensors][32];
  const char *name_of[kManyTensors];
  int i, rc;
  if (skewed && g_rank == g_size - 1) dims[3] = 11, dims[4] = 7;
  for (i = 0; i < kManyTensors; ++i) {
    snprintf(names[i], sizeof names[i], "%s.%d", prefix, i);
    name_of[i] = names[i];
  }
  rc = perseus_comm_world(&world);
  if (rc != PERSEUS_SUCCESS) return rc;
  if (g_rank % 2 == 0) {
    return perseus_comm_allreduce_many_async(world, kManyTensors, (const void *const *)bufs, bufs,
                                             kManyCounts, dtypes, PERSEUS_SUM, 1.0, 1.0, name_of,
                                             kManyNdims, dims, PERSEUS_DEVICE_CPU, NULL, requests);
  }
  {
    const int64_t *extents = dims;
    for (i = 0; i < kManyTensors; ++i) {
      requests[i] = NULL;
      rc = perseus_next_shape(extents, kManyNdims[i]);
      extents += kManyNdims[i];
      if (rc == PERSEUS_SUCCESS) {
        rc = perseus_comm_allreduce_async(world, bufs[i], bufs[i], kManyCounts[i], dtypes[i],
                                          PERSEUS_SUM, 1.0, 1.0, name_of[i], PERSEUS_DEVICE_CPU,
                                          NULL, &requests[i]);
      }
      if (rc != PERSEUS_SUCCESS) return rc;
    }
  }
  return PERSEUS_SUCCESS;
}

/* Every rank's tensor i holds rank + 1 + j % 3 at element j: the sum is known. */
static void fill_many(void **bufs) {
  size_t i, j;
  for (i = 0; i < kManyTensors; ++i) {
    bufs[i] = alloc(kManyCounts[i], kManyDtypes[i]);
    for (j = 0; j < kManyCounts[i]; ++j) put(bufs[i], kManyDtypes[i], j, g_rank + 1 + (int)(j % 3));
  }
}

static void check_many(void **bufs, size_t i, const char *prefix) {
  size_t j;
  for (j = 0; j < kManyCounts[i]; ++j) {
    const double want = (double)(g_size * (g_size + 1) / 2) + (double)g_size * (double)(j % 3);
    const double got = get(bufs[i], kManyDtypes[i], j);
    ++g_checks;
    if (got != want) report("many", prefix, j, want, got);
  }
}

/* 1. Two rounds of one group (the second on the negotiation's cached path): every result exact,
 *    whether this rank submitted it together or a tensor at a time.
 * 2. Tensor 2's shape differs on the last rank: tensor 2 fails on every rank naming both shapes
 *    (with more than one rank), the others succeed, and the job goes on.
 * 3. Tensor 1's dtype is not one: the call fails on every rank naming tensor 1 (odd ranks:
 *    their own call for it fails); tensor 0 was submitted and succeeds; requests[1..] are NULL
 *    (even ranks).
 * 4. Arguments refused before anything is submitted (bad_many_arguments). */
static void expect_refused(int rc, const char *what, const char *says) {
  ++g_checks;
  if (rc != PERSEUS_ERROR_INVALID_ARGUMENT || !strstr(perseus_last_error(), says)) {
    printf("rank %d: %s: expected INVALID_ARGUMENT saying '%s', got %d: %s\n", g_rank, what, says,
           rc, perseus_last_error());
    ++g_failures;
  }
}

static void bad_many_arguments(void) {
  perseus_comm_t *world = NULL;
  float data[4] = {0};
  const void *sends[1] = {data};
  void *recvs[1] = {data};
  const size_t counts[1] = {4};
  const int dtypes[1] = {PERSEUS_FLOAT32};
  const char *names[1] = {"refused"};
  const int ndims[1] = {-1};
  const int too_many[1] = {2};
  const int64_t dims[2] = {3, 2};
  perseus_request_t *requests[1] = {NULL};
  if (perseus_comm_world(&world) != PERSEUS_SUCCESS) {
    fail_call("perseus_comm_world", NULL, -1);
    return;
  }
  expect_refused(
      perseus_comm_allreduce_many_async(world, -1, sends, recvs, counts, dtypes, PERSEUS_SUM, 1.0,
                                        1.0, names, NULL, NULL, PERSEUS_DEVICE_CPU, NULL, requests),
      "n = -1", "n -1 is negative");
  expect_refused(
      perseus_comm_allreduce_many_async(world, 1, NULL, recvs, counts, dtypes, PERSEUS_SUM, 1.0,
                                        1.0, names, NULL, NULL, PERSEUS_DEVICE_CPU, NULL, requests),
      "sends NULL", "sends is NULL");
  expect_refused(
      perseus_comm_allreduce_many_async(world, 1, sends, recvs, counts, dtypes, PERSEUS_SUM, 1.0,
                                        1.0, names, NULL, NULL, PERSEUS_DEVICE_CPU, NULL, NULL),
      "requests NULL", "requests (the output array) is NULL");
  expect_refused(perseus_comm_allreduce_many_async(world, 1, sends, recvs, counts, dtypes,
                                                   PERSEUS_SUM, 1.0, 1.0, names, ndims, dims,
                                                   PERSEUS_DEVICE_CPU, NULL, requests),
                 "ndims -1", "tensor 0 ('refused'): ndims -1");
  expect_refused(perseus_comm_allreduce_many_async(world, 1, sends, recvs, counts, dtypes,
                                                   PERSEUS_SUM, 1.0, 1.0, names, too_many, dims,
                                                   PERSEUS_DEVICE_CPU, NULL, requests),
                 "a shape of 6 elements for 4", "holds 6 elements, but the call has 4");
  ++g_checks;
  if (requests[0] != NULL) {
    printf("rank %d: a refused tensor left a request behind\n", g_rank);
    ++g_failures;
  }
}

static int run_many(void) {
  void *bufs[kManyTensors];
  perseus_request_t *requests[kManyTensors];
  int dtypes[kManyTensors];
  int round, rc;
  size_t i;
  memcpy(dtypes, kManyDtypes, sizeof dtypes);
  for (round = 0; round < 2; ++round) {
    fill_many(bufs);
    rc = submit_many("many", 0, bufs, dtypes, requests);
    if (rc != PERSEUS_SUCCESS) {
      fail_call("submit_many", "many", rc);
      return 1;
    }
    for (i = 0; i < kManyTensors; ++i) {
      rc = perseus_wait(requests[i]);
      if (rc != PERSEUS_SUCCESS) fail_call("perseus_wait", "many", rc);
      perseus_release(requests[i]);
      check_many(bufs, i, "many");
      free(bufs[i]);
    }
  }
  fill_many(bufs);
  rc = submit_many("skewed", 1, bufs, dtypes, requests);
  if (rc != PERSEUS_SUCCESS) {
    fail_call("submit_many", "skewed", rc);
    return 1;
  }
  for (i = 0; i < kManyTensors; ++i) {
    rc = perseus_wait(requests[i]);
    if (i == 2 && g_size > 1) {
      ++g_checks;
      if (rc != PERSEUS_ERROR_INVALID_ARGUMENT || !strstr(perseus_last_error(), "[7, 11, 13]") ||
          !strstr(perseus_last_error(), "[11, 7, 13]")) {
        printf("rank %d: skewed.2: expected a shape mismatch naming both shapes, got %d: %s\n",
               g_rank, rc, perseus_last_error());
        ++g_failures;
      }
    } else if (rc != PERSEUS_SUCCESS) {
      fail_call("perseus_wait", "skewed", rc);
    } else {
      check_many(bufs, i, "skewed");
    }
    perseus_release(requests[i]);
    free(bufs[i]);
  }
  fill_many(bufs);
  dtypes[1] = 99;
  rc = submit_many("bad", 0, bufs, dtypes, requests);
  ++g_checks;
  if (rc != PERSEUS_ERROR_INVALID_ARGUMENT ||
      (g_rank % 2 == 0 && !strstr(perseus_last_error(), "tensor 1 ('bad.1')"))) {
    printf("rank %d: bad dtype in tensor 1: expected an error naming it, got %d: %s\n", g_rank, rc,
           perseus_last_error());
    ++g_failures;
  }
  for (i = 1; i < kManyTensors && g_rank % 2 == 0; ++i) {
    ++g_checks;
    if (requests[i] != NULL) {
      printf("rank %d: bad.%zu: expected no request after the failed tensor\n", g_rank, i);
      ++g_failures;
    }
  }
  rc = perseus_wait(requests[0]);
  if (rc != PERSEUS_SUCCESS) fail_call("perseus_wait", "bad.0", rc);
  perseus_release(requests[0]);
  check_many(bufs, 0, "bad");
  for (i = 0; i < kManyTensors; ++i) free(bufs[i]);
  bad_many_arguments();
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "matrix";
  int rc = perseus_init();
  if (rc != PERSEUS_SUCCESS) {
    fprintf(stderr, "perseus_init returned %d: %s\n", rc, perseus_last_error());
    return 1;
  }
  g_rank = perseus_rank();
  g_size = perseus_size();
  if (g_size > 16) {
    fprintf(stderr, "at most 16 ranks\n");
    return 2;
  }
  g_random = 0x9e3779b97f4a7c15ull ^ ((uint64_t)(g_rank + 1) * 0x2545f4914f6cdd1dull);
  if (strcmp(mode, "matrix") == 0) {
    if (argc > 2) g_iterations = (unsigned)atoi(argv[2]);
    rc = run_matrix();
  } else if (strcmp(mode, "mismatch") == 0) {
    rc = run_mismatch();
  } else if (strcmp(mode, "join") == 0) {
    rc = run_join();
  } else if (strcmp(mode, "nullzero") == 0) {
    rc = run_nullzero();
  } else if (strcmp(mode, "many") == 0) {
    rc = run_many();
  } else if (strcmp(mode, "timeline") == 0) {
    rc = run_timeline();
  } else {
    fprintf(stderr, "unknown mode '%s'\n", mode);
    return 2;
  }
  if (rc == 0 && g_failures == 0) {
    rc = perseus_finalize();
    if (rc != PERSEUS_SUCCESS) {
      fprintf(stderr, "perseus_finalize returned %d: %s\n", rc, perseus_last_error());
      return 1;
    }
    printf("ok (%ld checks)\n", g_checks);
    return 0;
  }
  if (g_failures > MAX_FAILURES) printf("rank %d: ... %d failures\n", g_rank, g_failures);
  fflush(stdout);
  return 1;
}

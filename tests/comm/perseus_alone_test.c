/* A program for tests/comm/test_alone.py, started alone (no launcher): perseus_init makes it a
 * job of one rank. Checks its place, every operation on every dtype with odd counts (each must
 * give back its input, or the scaled input), a process set of rank 0, join, and that nothing
 * listens or stays behind: no socket is opened and no thread is left after perseus_finalize.
 * Does it all twice (init, finalize, init again), after perseus_host_pack/unpack (no init).
 * Prints "ok (N checks)" and exits 0, or says what differed and exits 1. C99 and Linux's /proc;
 * only perseus.h. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "perseus/perseus.h"

static int g_failures, g_checks;

static void check(int rc, const char *what) {
  if (rc != PERSEUS_SUCCESS) {
    fprintf(stderr, "%s failed (%d): %s\n", what, rc, perseus_last_error());
    exit(1);
  }
}

static void expect(int ok, const char *what, int dtype, size_t count) {
  ++g_checks;
  if (!ok) {
    fprintf(stderr, "wrong: %s (dtype %d, count %zu)\n", what, dtype, count);
    ++g_failures;
  }
}

/* The entries of a /proc/self folder; with `sockets`, only the fds that are sockets. */
static int count_entries(const char *folder, int sockets) {
  DIR *dir = opendir(folder);
  struct dirent *entry;
  int n = 0;
  if (!dir) {
    perror(folder);
    exit(1);
  }
  while ((entry = readdir(dir)) != NULL) {
    char path[512], target[256];
    ssize_t length;
    if (entry->d_name[0] == '.') continue;
    if (!sockets) {
      ++n;
      continue;
    }
    snprintf(path, sizeof path, "%s/%s", folder, entry->d_name);
    length = readlink(path, target, sizeof target - 1);
    if (length > 0) {
      target[length] = '\0';
      if (strncmp(target, "socket:", 7) == 0) ++n;
    }
  }
  closedir(dir);
  return n;
}

static size_t size_of(int dtype) {
  switch (dtype) {
    case PERSEUS_UINT8:
    case PERSEUS_INT8:
      return 1;
    case PERSEUS_FLOAT16:
    case PERSEUS_BFLOAT16:
    case PERSEUS_INT16:
      return 2;
    case PERSEUS_INT32:
    case PERSEUS_FLOAT32:
      return 4;
    default:
      return 8;
  }
}

/* Element i of a buffer of `dtype`: small whole numbers, exact in every type (float16 and
 * bfloat16 as their bit patterns: 1.0 is 0x3c00 and 0x3f80, 2.0 is 0x4000 both ways). */
static void fill(void *buffer, int dtype, size_t count, int salt) {
  size_t i;
  for (i = 0; i < count; ++i) {
    const int v = (int)((i * 7 + (size_t)salt) % 5) + 1;
    switch (dtype) {
      case PERSEUS_UINT8:
        ((uint8_t *)buffer)[i] = (uint8_t)v;
        break;
      case PERSEUS_INT8:
        ((int8_t *)buffer)[i] = (int8_t)-v;
        break;
      case PERSEUS_INT16:
        ((int16_t *)buffer)[i] = (int16_t)(v * 300);
        break;
      case PERSEUS_INT32:
        ((int32_t *)buffer)[i] = -v * 100000;
        break;
      case PERSEUS_INT64:
        ((int64_t *)buffer)[i] = (int64_t)v << 40;
        break;
      case PERSEUS_FLOAT16:
        ((uint16_t *)buffer)[i] = v % 2 ? 0x3c00 : 0x4000;
        break;
      case PERSEUS_BFLOAT16:
        ((uint16_t *)buffer)[i] = v % 2 ? 0x3f80 : 0x4000;
        break;
      case PERSEUS_FLOAT32:
        ((float *)buffer)[i] = (float)v * 0.5f;
        break;
      default:
        ((double *)buffer)[i] = v * 0.25;
        break;
    }
  }
}

static const size_t kCounts[] = {0, 1, 7, 1001};
static const int kDtypes[] = {PERSEUS_UINT8,    PERSEUS_INT8,    PERSEUS_INT16,
                              PERSEUS_INT32,    PERSEUS_INT64,   PERSEUS_FLOAT16,
                              PERSEUS_BFLOAT16, PERSEUS_FLOAT32, PERSEUS_FLOAT64};

static void check_reductions(int dtype, size_t count, const void *in, void *out, size_t bytes) {
  int op;
  char name[64];
  for (op = PERSEUS_SUM; op <= PERSEUS_PRODUCT; ++op) {
    perseus_request_t *request = NULL;
    memset(out, 0xee, bytes + 1);
    snprintf(name, sizeof name, "allreduce.%d.%zu.%d", dtype, count, op);
    check(perseus_allreduce(in, out, count, dtype, op, name), "perseus_allreduce");
    expect(memcmp(in, out, bytes) == 0, "allreduce of one rank gives its input", dtype, count);
    expect(((unsigned char *)out)[bytes] == 0xee, "allreduce writes no further", dtype, count);
    memcpy(out, in, bytes);
    snprintf(name, sizeof name, "allreduce.inplace.%d.%zu.%d", dtype, count, op);
    check(perseus_allreduce_async(out, out, count, dtype, op, 1.0, 1.0, name, PERSEUS_DEVICE_CPU,
                                  NULL, &request),
          "perseus_allreduce_async");
    check(perseus_wait(request), "perseus_wait (allreduce)");
    perseus_release(request);
    expect(memcmp(in, out, bytes) == 0, "in-place allreduce gives its input", dtype, count);
  }
}

static void check_scaled(size_t count) {
  double in[1001], out[1001];
  size_t i;
  perseus_request_t *request = NULL;
  fill(in, PERSEUS_FLOAT64, count, 3);
  check(perseus_allreduce_async(in, out, count, PERSEUS_FLOAT64, PERSEUS_AVERAGE, 2.0, 3.0,
                                "scaled", PERSEUS_DEVICE_CPU, NULL, &request),
        "perseus_allreduce_async (scaled)");
  check(perseus_wait(request), "perseus_wait (scaled)");
  perseus_release(request);
  for (i = 0; i < count; ++i) {
    expect(out[i] == in[i] * 6.0, "prescale 2, postscale 3: six times the input", PERSEUS_FLOAT64,
           count);
  }
}

static void check_movers(int dtype, size_t count, const void *in, void *out, size_t bytes) {
  size_t counts[1] = {count}, got[1] = {99};
  perseus_request_t *request = NULL;
  char name[64];

  memcpy(out, in, bytes);
  snprintf(name, sizeof name, "broadcast.%d.%zu", dtype, count);
  check(perseus_broadcast(out, count, dtype, 0, name), "perseus_broadcast");
  expect(memcmp(in, out, bytes) == 0, "broadcast from rank 0 leaves it", dtype, count);

  memset(out, 0, bytes);
  snprintf(name, sizeof name, "allgather.%d.%zu", dtype, count);
  check(perseus_allgather(in, out, count, dtype, name), "perseus_allgather");
  expect(memcmp(in, out, bytes) == 0, "allgather of one rank is its input", dtype, count);

  memset(out, 0, bytes);
  snprintf(name, sizeof name, "allgatherv.%d.%zu", dtype, count);
  check(perseus_allgatherv_async(in, count, dtype, name, PERSEUS_DEVICE_CPU, NULL, &request),
        "perseus_allgatherv_async");
  check(perseus_wait(request), "perseus_wait (allgatherv)");
  check(perseus_output_counts(request, got), "perseus_output_counts (allgatherv)");
  check(perseus_output_copy(request, out), "perseus_output_copy (allgatherv)");
  perseus_release(request);
  expect(got[0] == count && memcmp(in, out, bytes) == 0, "allgatherv is its input", dtype, count);

  memset(out, 0, bytes);
  got[0] = 99;
  snprintf(name, sizeof name, "alltoall.%d.%zu", dtype, count);
  check(perseus_alltoall_async(in, counts, dtype, name, PERSEUS_DEVICE_CPU, NULL, &request),
        "perseus_alltoall_async");
  check(perseus_wait(request), "perseus_wait (alltoall)");
  check(perseus_output_counts(request, got), "perseus_output_counts (alltoall)");
  check(perseus_output_copy(request, out), "perseus_output_copy (alltoall)");
  perseus_release(request);
  expect(got[0] == count && memcmp(in, out, bytes) == 0, "alltoall is its input", dtype, count);

  memset(out, 0, bytes);
  snprintf(name, sizeof name, "reducescatter.%d.%zu", dtype, count);
  check(perseus_reducescatter_async(in, out, counts, dtype, PERSEUS_SUM, 1.0, 1.0, name,
                                    PERSEUS_DEVICE_CPU, NULL, &request),
        "perseus_reducescatter_async");
  check(perseus_wait(request), "perseus_wait (reducescatter)");
  perseus_release(request);
  expect(memcmp(in, out, bytes) == 0, "reducescatter is its input", dtype, count);
}

static void check_process_set(void) {
  const int zero = 0;
  int set = -1;
  float in[5] = {1, 2, 3, 4, 5}, out[5] = {0}, buffer[5] = {9, 8, 7, 6, 5};
  size_t got[1] = {0};
  perseus_request_t *request = NULL;
  check(perseus_add_process_set(&zero, 1, &set), "perseus_add_process_set([0])");
  expect(set > 0, "the set of rank 0 gets a number above 0", PERSEUS_FLOAT32, 1);
  check(perseus_allreduce_async_in(set, in, out, 5, PERSEUS_FLOAT32, PERSEUS_AVERAGE, 1.0, 1.0,
                                   "in set", &request),
        "perseus_allreduce_async_in");
  check(perseus_wait(request), "perseus_wait (allreduce in set)");
  perseus_release(request);
  expect(memcmp(in, out, sizeof in) == 0, "allreduce in the set is its input", PERSEUS_FLOAT32, 5);
  check(perseus_broadcast_async_in(set, buffer, 5, PERSEUS_FLOAT32, 0, "in set", &request),
        "perseus_broadcast_async_in");
  check(perseus_wait(request), "perseus_wait (broadcast in set)");
  perseus_release(request);
  expect(buffer[0] == 9 && buffer[4] == 5, "broadcast in the set leaves it", PERSEUS_FLOAT32, 5);
  memset(out, 0, sizeof out);
  check(perseus_allgatherv_async_in(set, in, 5, PERSEUS_FLOAT32, "in set", &request),
        "perseus_allgatherv_async_in");
  check(perseus_wait(request), "perseus_wait (allgatherv in set)");
  check(perseus_output_counts(request, got), "perseus_output_counts (in set)");
  check(perseus_output_copy(request, out), "perseus_output_copy (in set)");
  perseus_release(request);
  expect(got[0] == 5 && memcmp(in, out, sizeof in) == 0, "allgatherv in the set is its input",
         PERSEUS_FLOAT32, 5);
}

/* perseus_host_pack and perseus_host_unpack, which need no perseus_init: pieces of odd sizes
 * (one empty, with a NULL pointer) packed in order and unpacked back; bad arguments refused
 * with nothing copied. */
static void check_host_pack(void) {
  unsigned char a[3] = {1, 2, 3}, b[7] = {4, 5, 6, 7, 8, 9, 10}, c[1] = {11};
  unsigned char whole[11], back_a[3] = {0}, back_b[7] = {0}, back_c[1] = {0};
  const void *srcs[4] = {a, NULL, b, c};
  void *dsts[4] = {back_a, NULL, back_b, back_c};
  const size_t bytes[4] = {3, 0, 7, 1};
  const size_t one_byte[1] = {1};
  const void *null_src[1] = {NULL};
  size_t i;
  int ok = 1;
  memset(whole, 0xee, sizeof whole);
  check(perseus_host_pack(whole, 4, srcs, bytes), "perseus_host_pack");
  for (i = 0; i < sizeof whole; ++i) ok &= whole[i] == i + 1;
  expect(ok, "host_pack puts the pieces one after the other", PERSEUS_UINT8, sizeof whole);
  check(perseus_host_unpack(whole, 4, dsts, bytes), "perseus_host_unpack");
  expect(memcmp(a, back_a, 3) == 0 && memcmp(b, back_b, 7) == 0 && back_c[0] == 11,
         "host_unpack gives each piece back", PERSEUS_UINT8, sizeof whole);
  check(perseus_host_pack(NULL, 0, NULL, NULL), "perseus_host_pack of nothing");
  memset(whole, 0xee, sizeof whole);
  expect(perseus_host_pack(whole, -1, srcs, bytes) == PERSEUS_ERROR_INVALID_ARGUMENT &&
             strstr(perseus_last_error(), "n is -1") != NULL,
         "host_pack refuses n < 0, naming it", PERSEUS_UINT8, 0);
  expect(perseus_host_pack(whole, 1, null_src, one_byte) == PERSEUS_ERROR_INVALID_ARGUMENT &&
             strstr(perseus_last_error(), "srcs[0] is NULL") != NULL,
         "host_pack refuses a NULL piece of 1 byte, naming it", PERSEUS_UINT8, 1);
  expect(perseus_host_pack(NULL, 4, srcs, bytes) == PERSEUS_ERROR_INVALID_ARGUMENT,
         "host_pack refuses a NULL dst", PERSEUS_UINT8, 11);
  expect(perseus_host_pack(whole, 4, srcs, NULL) == PERSEUS_ERROR_INVALID_ARGUMENT,
         "host_pack refuses NULL bytes", PERSEUS_UINT8, 11);
  expect(whole[0] == 0xee && whole[10] == 0xee, "a refused host_pack copied nothing", PERSEUS_UINT8,
         11);
  memset(back_a, 0, sizeof back_a);
  dsts[3] = NULL;
  expect(perseus_host_unpack(whole, 4, dsts, bytes) == PERSEUS_ERROR_INVALID_ARGUMENT &&
             strstr(perseus_last_error(), "dsts[3] is NULL") != NULL && back_a[0] == 0,
         "host_unpack refuses a NULL piece late in the list before copying any", PERSEUS_UINT8, 11);
}

static void one_job(int round, int sockets_before) {
  static unsigned char in[1001 * 8], out[1001 * 8 + 1];
  size_t d, c;
  int last = -1;
  check(perseus_init(), "perseus_init");
  expect(perseus_rank() == 0 && perseus_size() == 1, "rank 0 of 1", round, 0);
  expect(perseus_local_rank() == 0 && perseus_local_size() == 1, "local rank 0 of 1", round, 0);
  expect(perseus_cross_rank() == 0 && perseus_cross_size() == 1, "cross rank 0 of 1", round, 0);
  for (d = 0; d < sizeof kDtypes / sizeof kDtypes[0]; ++d) {
    for (c = 0; c < sizeof kCounts / sizeof kCounts[0]; ++c) {
      const size_t bytes = kCounts[c] * size_of(kDtypes[d]);
      fill(in, kDtypes[d], kCounts[c], round);
      check_reductions(kDtypes[d], kCounts[c], in, out, bytes);
      check_movers(kDtypes[d], kCounts[c], in, out, bytes);
    }
  }
  check_scaled(1001);
  check(perseus_barrier(), "perseus_barrier");
  check_process_set();
  expect(count_entries("/proc/self/fd", 1) == sockets_before, "no socket opened", round, 0);
  check(perseus_join(PERSEUS_DEVICE_CPU, &last), "perseus_join");
  expect(last == 0, "join: rank 0 is the last to join", round, 0);
  check(perseus_finalize(), "perseus_finalize");
  expect(perseus_rank() == PERSEUS_ERROR_NOT_INITIALIZED, "not initialised after finalize", round,
         0);
}

int main(void) {
  const int threads_before = count_entries("/proc/self/task", 0);
  const int sockets_before = count_entries("/proc/self/fd", 1);
  int round;
  int waited;
  check_host_pack();
  for (round = 0; round < 2; ++round) {
    one_job(round, sockets_before);
    /* Allow a loaded machine up to 5 s for the threads to be gone (seen once in CI: one
     * thread more right after perseus_finalize, on a 2-core machine under load). */
    waited = 0;
    while (count_entries("/proc/self/task", 0) != threads_before && waited < 500) {
      usleep(10000);
      ++waited;
    }
    expect(count_entries("/proc/self/task", 0) == threads_before,
           "no thread left after perseus_finalize", round, 0);
  }
  if (g_failures) {
    fprintf(stderr, "%d of %d checks failed\n", g_failures, g_checks);
    return 1;
  }
  printf("ok (%d checks)\n", g_checks);
  return 0;
}

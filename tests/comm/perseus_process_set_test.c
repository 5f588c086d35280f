/* A rank program for tests/comm/test_async.py: process sets. With N ranks (N >= 3): set A is
 * the even ranks, set B the odd ones, set C every rank but 0. Each rank all-reduces, broadcasts
 * and all-gathers within its sets while set 0 all-reduces run in between, then checks every
 * result against what it can compute itself; a rank outside a set must be refused. Then the
 * same through communicator handles (perseus_comm_*), and a handle of the first perseus_init
 * refused after a second one.
 * Prints "ok (N checks)" and exits 0, or says what differed and exits 1. C99; only perseus.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perseus/perseus.h"

static int g_rank, g_size, g_failures, g_checks;

static void check(int rc, const char *what) {
  if (rc != PERSEUS_SUCCESS) {
    fprintf(stderr, "rank %d: %s failed (%d): %s\n", g_rank, what, rc, perseus_last_error());
    exit(1);
  }
}

static void expect(int ok, const char *what) {
  ++g_checks;
  if (!ok) {
    fprintf(stderr, "rank %d: wrong: %s\n", g_rank, what);
    ++g_failures;
  }
}

static int make_set(int parity_or_minus1, int *members) {
  int r, n = 0, id = -1;
  for (r = 0; r < g_size; ++r) {
    if (parity_or_minus1 < 0 ? r != 0 : r % 2 == parity_or_minus1) members[n++] = r;
  }
  check(perseus_add_process_set(members, n, &id), "perseus_add_process_set");
  return id;
}

static int in(const int *members, int n, int rank) {
  int i;
  for (i = 0; i < n; ++i)
    if (members[i] == rank) return 1;
  return 0;
}

static int count_of(int parity_or_minus1) {
  int r, n = 0;
  for (r = 0; r < g_size; ++r)
    if (parity_or_minus1 < 0 ? r != 0 : r % 2 == parity_or_minus1) ++n;
  return n;
}

static perseus_comm_t *g_world;

/* The communicator handles: the world, a communicator of the even ranks, the collectives
 * through them, and what is refused. */
static void check_communicators(int last_set) {
  perseus_comm_t *world = NULL, *evens = NULL;
  perseus_request_t *req = NULL;
  int members[64], n = 0, r, value = 0, set = -1, index = 0, size = 0;
  double x = g_rank + 1, sum = 0;
  check(perseus_comm_world(&world), "perseus_comm_world");
  g_world = world;
  check(perseus_comm_size(world, &size), "perseus_comm_size");
  check(perseus_comm_rank(world, &index), "perseus_comm_rank");
  check(perseus_comm_process_set(world, &set), "perseus_comm_process_set");
  expect(size == g_size && index == g_rank && set == 0, "the world is every rank, set 0");
  for (r = 0; r < g_size; r += 2) members[n++] = r;
  /* Given in decreasing order: the set is the same ranks in rank order. */
  {
    int reversed[64], i;
    for (i = 0; i < n; ++i) reversed[i] = members[n - 1 - i];
    check(perseus_comm_create(reversed, n, &evens), "perseus_comm_create");
  }
  check(perseus_comm_process_set(evens, &set), "perseus_comm_process_set");
  expect(set == last_set + 1, "a new communicator is the next process set");
  check(perseus_comm_size(evens, &size), "perseus_comm_size");
  check(perseus_comm_rank(evens, &index), "perseus_comm_rank");
  expect(size == n, "the communicator's size is its members");
  expect(index == (g_rank % 2 == 0 ? g_rank / 2 : -1), "the index among members, -1 outside");

  /* Every rank, through the world handle. */
  check(perseus_comm_allreduce_async(world, &x, &sum, 1, PERSEUS_FLOAT64, PERSEUS_SUM, 1.0, 1.0,
                                     "comm.world", PERSEUS_DEVICE_CPU, NULL, &req),
        "perseus_comm_allreduce_async (world)");
  check(perseus_wait(req), "wait");
  perseus_release(req);
  expect(sum == (double)g_size * (g_size + 1) / 2.0, "all-reduce through the world handle");

  if (g_rank % 2 == 0) {
    /* Member i keeps i + 1 elements; element j of the input is (rank + 1) * (j + 1). */
    size_t counts[64], total = 0, first = 0, i;
    double send[64 * 65], recv[65], members_sum = 0;
    for (i = 0; i < (size_t)n; ++i) {
      counts[i] = i + 1;
      if ((int)i == index) first = total;
      total += counts[i];
      members_sum += members[i] + 1;
    }
    for (i = 0; i < total; ++i) send[i] = (g_rank + 1) * (double)(i + 1);
    check(perseus_comm_reducescatter_async(evens, send, recv, counts, PERSEUS_FLOAT64, PERSEUS_SUM,
                                           1.0, 1.0, "comm.rs", PERSEUS_DEVICE_CPU, NULL, &req),
          "perseus_comm_reducescatter_async");
    check(perseus_wait(req), "wait reducescatter");
    perseus_release(req);
    for (i = 0; i < counts[index]; ++i) {
      expect(recv[i] == members_sum * (double)(first + i + 1), "reduce-scatter in a communicator");
    }
    value = g_rank == members[n - 1] ? 77 : 0;
    check(perseus_comm_broadcast_async(evens, &value, 1, PERSEUS_INT32, members[n - 1], "comm.b",
                                       PERSEUS_DEVICE_CPU, NULL, &req),
          "perseus_comm_broadcast_async");
    check(perseus_wait(req), "wait broadcast");
    perseus_release(req);
    expect(value == 77, "broadcast in a communicator from its last member");
    {
      /* The blocking all-reduce: scale factors, a shape, then shapes that disagree (the same
       * count) refused on every member, naming both. */
      float v[6], want = 0;
      int64_t mine[2] = {2, 3}, skewed[2] = {3, 2};
      int rc;
      for (i = 0; i < 6; ++i) v[i] = (float)(g_rank + 1) * (float)(i + 1);
      for (i = 0; i < (size_t)n; ++i) want += (float)(members[i] + 1);
      check(perseus_next_shape(mine, 2), "perseus_next_shape");
      check(perseus_comm_allreduce(evens, v, v, 6, PERSEUS_FLOAT32, PERSEUS_SUM, 2.0, 0.5,
                                   "comm.blocking", PERSEUS_DEVICE_CPU, NULL),
            "perseus_comm_allreduce");
      for (i = 0; i < 6; ++i) {
        expect(v[i] == want * (float)(i + 1), "blocking all-reduce in a communicator");
      }
      check(perseus_next_shape(index == n - 1 && n > 1 ? skewed : mine, 2), "perseus_next_shape");
      rc = perseus_comm_allreduce(evens, v, v, 6, PERSEUS_FLOAT32, PERSEUS_SUM, 1.0, 1.0,
                                  "comm.blocking.skew", PERSEUS_DEVICE_CPU, NULL);
      if (n > 1) {
        expect(rc == PERSEUS_ERROR_INVALID_ARGUMENT, "skewed shapes refused on every member");
        expect(strstr(perseus_last_error(), "disagree on its shape") != NULL &&
                   strstr(perseus_last_error(), "[3, 2]") != NULL,
               "the refusal names the shapes");
      } else {
        expect(rc == PERSEUS_SUCCESS, "a communicator of one agrees with itself");
      }
      /* perseus_comm_allreduce_submit and perseus_wait_release: the same result, the shape
       * checked as perseus_next_shape's (a 3-D shape that disagrees in its last two extents,
       * the same count, refused on every member), a bad shape or a struct of another size
       * refused before anything is submitted, ndims -1 meaning no shape, and a failure's
       * message kept after the request is freed. */
      {
        int64_t cube[3] = {1, 2, 3}, turned[3] = {1, 3, 2}, negative[2] = {-2, -3};
        perseus_allreduce_args_t args;
        memset(&args, 0, sizeof args);
        args.size = sizeof args;
        args.dtype = PERSEUS_FLOAT32;
        args.op = PERSEUS_SUM;
        args.device = PERSEUS_DEVICE_CPU;
        args.send = v;
        args.recv = v;
        args.count = 6;
        args.prescale = 1.0;
        args.postscale = 1.0;
        args.dims = cube;
        args.ndims = 3;
        for (i = 0; i < 6; ++i) v[i] = (float)(g_rank + 1) * (float)(i + 1);
        check(perseus_comm_allreduce_submit(evens, &args, "comm.submit", &req),
              "perseus_comm_allreduce_submit");
        check(perseus_wait_release(req), "perseus_wait_release");
        for (i = 0; i < 6; ++i) {
          expect(v[i] == want * (float)(i + 1), "the submitted all-reduce in a communicator");
        }
        /* Postscale and Average from the struct; no shape (ndims -1, dims ignored). */
        for (i = 0; i < 6; ++i) v[i] = (float)(g_rank + 1) * (float)(i + 1);
        args.op = PERSEUS_AVERAGE;
        args.postscale = 2.0;
        args.dims = negative;
        args.ndims = -1;
        check(perseus_comm_allreduce_submit(evens, &args, "comm.submit.avg", &req),
              "perseus_comm_allreduce_submit (average, no shape)");
        check(perseus_wait_release(req), "perseus_wait_release (average)");
        for (i = 0; i < 6; ++i) {
          const float expected = 2.0f * want / (float)n * (float)(i + 1);
          expect(v[i] - expected < 1e-5f * expected && expected - v[i] < 1e-5f * expected,
                 "the average, postscaled, in a communicator");
        }
        for (i = 0; i < 6; ++i) v[i] = (float)(g_rank + 1) * (float)(i + 1);
        args.op = PERSEUS_SUM;
        args.postscale = 1.0;
        args.dims = index == 0 && n > 1 ? turned : cube;
        args.ndims = 3;
        check(perseus_comm_allreduce_submit(evens, &args, "comm.submit.skew", &req),
              "perseus_comm_allreduce_submit (skewed)");
        rc = perseus_wait_release(req);
        if (n > 1) {
          expect(rc == PERSEUS_ERROR_INVALID_ARGUMENT, "skewed 3-D shapes refused on every member");
          expect(strstr(perseus_last_error(), "[1, 3, 2]") != NULL &&
                     strstr(perseus_last_error(), "[1, 2, 3]") != NULL,
                 "the refusal, read after perseus_wait_release freed the request, names both");
        } else {
          expect(rc == PERSEUS_SUCCESS, "one member's shape agrees with itself");
        }
        req = (perseus_request_t *)&x; /* must be set to NULL by a refused call */
        args.dims = negative;
        args.ndims = 2;
        expect(perseus_comm_allreduce_submit(evens, &args, "comm.submit.bad", &req) ==
                       PERSEUS_ERROR_INVALID_ARGUMENT &&
                   req == NULL,
               "a negative extent refused, nothing submitted");
        expect(strstr(perseus_last_error(), "perseus_comm_allreduce_submit") != NULL &&
                   strstr(perseus_last_error(), "is negative") != NULL,
               "that refusal names the call and the extent");
        args.dims = cube;
        expect(perseus_comm_allreduce_submit(evens, &args, "comm.submit.bad", &req) ==
                   PERSEUS_ERROR_INVALID_ARGUMENT,
               "a shape whose product is not the count refused");
        expect(strstr(perseus_last_error(), "holds 2 elements, but the call has 6") != NULL &&
                   strstr(perseus_last_error(), "dims of perseus_allreduce_args_t") != NULL,
               "that refusal names where the shape came from");
        args.size = (uint32_t)sizeof args - 8;
        args.ndims = 3;
        expect(perseus_comm_allreduce_submit(evens, &args, "comm.submit.bad", &req) ==
                   PERSEUS_ERROR_INVALID_ARGUMENT,
               "a struct of another size refused");
        expect(strstr(perseus_last_error(), "args->size is") != NULL,
               "that refusal names the size");
        expect(perseus_comm_allreduce_submit(evens, NULL, "comm.submit.bad", &req) ==
                   PERSEUS_ERROR_INVALID_ARGUMENT,
               "args NULL refused");
        /* The refused calls left no shape behind: the next call without one is not checked
         * against a stale shape (the other members give none either). */
        check(perseus_comm_allreduce_async(evens, v, v, 6, PERSEUS_FLOAT32, PERSEUS_SUM, 1.0, 1.0,
                                           "comm.submit.after", PERSEUS_DEVICE_CPU, NULL, &req),
              "perseus_comm_allreduce_async after refused submissions");
        check(perseus_wait_release(req), "perseus_wait_release (after)");
        expect(perseus_wait_release(NULL) == PERSEUS_ERROR_INVALID_ARGUMENT,
               "perseus_wait_release(NULL) refused");
      }
    }
    check(perseus_comm_barrier(evens), "perseus_comm_barrier");
  } else {
    expect(perseus_comm_barrier(evens) == PERSEUS_ERROR_INVALID_ARGUMENT,
           "a non-member's barrier refused");
    expect(strstr(perseus_last_error(), "not a member") != NULL, "the refusal says why");
    expect(perseus_comm_allreduce(evens, &x, &x, 1, PERSEUS_FLOAT64, PERSEUS_SUM, 1.0, 1.0,
                                  "comm.blocking", PERSEUS_DEVICE_CPU,
                                  NULL) == PERSEUS_ERROR_INVALID_ARGUMENT,
           "a non-member's blocking all-reduce refused");
    expect(strstr(perseus_last_error(), "not a member") != NULL, "that refusal says why");
  }
  expect(perseus_comm_allreduce(NULL, &x, &x, 1, PERSEUS_FLOAT64, PERSEUS_SUM, 1.0, 1.0, "null",
                                PERSEUS_DEVICE_CPU, NULL) == PERSEUS_ERROR_INVALID_ARGUMENT,
         "a NULL communicator refused (blocking)");
  expect(perseus_comm_allreduce_async(NULL, &x, &x, 1, PERSEUS_FLOAT64, PERSEUS_SUM, 1.0, 1.0,
                                      "null", PERSEUS_DEVICE_CPU, NULL,
                                      &req) == PERSEUS_ERROR_INVALID_ARGUMENT,
         "a NULL communicator refused");
  expect(strstr(perseus_last_error(), "comm is NULL") != NULL, "the refusal names comm");
  check(perseus_comm_barrier(world), "perseus_comm_barrier (world)");
}

/* After perseus_finalize and a new perseus_init, the first init's handle is refused by name,
 * and the new world's works. */
static void check_stale_handle_after_reinit(void) {
  perseus_comm_t *world = NULL;
  double x = 1, y = 0;
  perseus_request_t *req = NULL;
  check(perseus_init(), "perseus_init (again)");
  expect(perseus_comm_barrier(g_world) == PERSEUS_ERROR_INVALID_ARGUMENT,
         "the first init's world refused");
  expect(strstr(perseus_last_error(), "perseus_init #1") != NULL, "the refusal names its init");
  check(perseus_comm_world(&world), "perseus_comm_world (again)");
  expect(world != g_world, "the new world is a new handle");
  check(perseus_comm_allreduce_async(world, &x, &y, 1, PERSEUS_FLOAT64, PERSEUS_SUM, 1.0, 1.0,
                                     "again", PERSEUS_DEVICE_CPU, NULL, &req),
        "allreduce in the new world");
  check(perseus_wait(req), "wait");
  perseus_release(req);
  expect(y == (double)g_size, "all-reduce in the new world");
  check(perseus_finalize(), "perseus_finalize (again)");
}

int main(void) {
  int even[64], odd[64], notzero[64];
  int set_even, set_odd, set_c, mine, round;
  check(perseus_init(), "perseus_init");
  g_rank = perseus_rank();
  g_size = perseus_size();
  if (g_size < 3 || g_size > 64) {
    fprintf(stderr, "run with 3 to 64 ranks\n");
    return 2;
  }
  set_even = make_set(0, even);
  set_odd = make_set(1, odd);
  set_c = make_set(-1, notzero);
  expect(set_even > 0 && set_odd > set_even && set_c > set_odd, "set numbers 1, 2, 3 in order");
  mine = g_rank % 2 == 0 ? set_even : set_odd;

  for (round = 0; round < 3; ++round) {
    perseus_request_t *req[4];
    double x = g_rank + 1, sum = 0, global = g_rank + 1, expected = 0, c = g_rank + 1;
    int r, members = count_of(g_rank % 2);
    char name[64];
    /* Within this rank's parity set, a set-0 all-reduce in between, and set C. */
    snprintf(name, sizeof name, "parity.%d", round);
    check(perseus_allreduce_async_in(mine, &x, &sum, 1, PERSEUS_FLOAT64, PERSEUS_SUM, 1.0, 1.0,
                                     name, &req[0]),
          "allreduce in set");
    snprintf(name, sizeof name, "global.%d", round);
    check(perseus_allreduce_async(&global, &global, 1, PERSEUS_FLOAT64, PERSEUS_SUM, 1.0, 1.0, name,
                                  PERSEUS_DEVICE_CPU, NULL, &req[1]),
          "allreduce in set 0");
    if (g_rank != 0) {
      snprintf(name, sizeof name, "c.%d", round);
      check(perseus_allreduce_async_in(set_c, &c, &c, 1, PERSEUS_FLOAT64, PERSEUS_AVERAGE, 1.0, 1.0,
                                       name, &req[2]),
            "allreduce in set C");
      check(perseus_wait(req[2]), "wait set C");
      perseus_release(req[2]);
      /* average of 2..N */
      expect(c == (double)(g_size + 2) / 2.0, "average in set C");
    }
    check(perseus_wait(req[0]), "wait in set");
    check(perseus_wait(req[1]), "wait set 0");
    perseus_release(req[0]);
    perseus_release(req[1]);
    for (r = g_rank % 2; r < g_size; r += 2) expected += r + 1;
    expect(sum == expected, "sum within the parity set");
    expect(global == (double)g_size * (g_size + 1) / 2.0, "sum over every rank");
    (void)members;
  }

  { /* Broadcast in set C from its last rank; all-gather of different counts in set B. */
    int value = g_rank == g_size - 1 ? 4242 : -1;
    perseus_request_t *req;
    if (g_rank != 0) {
      check(perseus_broadcast_async_in(set_c, &value, 1, PERSEUS_INT32, g_size - 1, "bcast", &req),
            "broadcast in set C");
      check(perseus_wait(req), "wait broadcast");
      perseus_release(req);
      expect(value == 4242, "broadcast in set C");
    }
    if (g_rank % 2 == 1) {
      int send[64], got[64 * 64], i, k = 0, n = count_of(1);
      size_t counts[64];
      for (i = 0; i <= g_rank; ++i) send[i] = g_rank * 100 + i;
      check(perseus_allgatherv_async_in(set_odd, send, (size_t)g_rank + 1, PERSEUS_INT32, "gather",
                                        &req),
            "allgatherv in set B");
      check(perseus_wait(req), "wait allgatherv");
      check(perseus_output_counts(req, counts), "output_counts");
      check(perseus_output_copy(req, got), "output_copy");
      perseus_release(req);
      for (i = 0; i < n; ++i) {
        int r = odd[i], j;
        expect(counts[i] == (size_t)r + 1, "allgatherv count of a member");
        for (j = 0; j <= r; ++j) expect(got[k++] == r * 100 + j, "allgatherv data of a member");
      }
    }
  }

  { /* Refusals: a rank outside the set, a set that does not exist, bad ranks. */
    double y = 1;
    int bad[2] = {0, 0}, id;
    perseus_request_t *req = NULL;
    int other = g_rank % 2 == 0 ? set_odd : set_even;
    expect(perseus_allreduce_async_in(other, &y, &y, 1, PERSEUS_FLOAT64, PERSEUS_SUM, 1.0, 1.0,
                                      "outsider", &req) == PERSEUS_ERROR_INVALID_ARGUMENT,
           "a non-member's submission refused");
    expect(strstr(perseus_last_error(), "not a member") != NULL, "the refusal says why");
    expect(perseus_allreduce_async_in(99, &y, &y, 1, PERSEUS_FLOAT64, PERSEUS_SUM, 1.0, 1.0,
                                      "nowhere", &req) == PERSEUS_ERROR_INVALID_ARGUMENT,
           "an unknown set refused");
    expect(perseus_add_process_set(bad, 2, &id) == PERSEUS_ERROR_INVALID_ARGUMENT,
           "a rank given twice refused");
    (void)in;
  }

  check_communicators(set_c);
  check(perseus_barrier(), "barrier");
  check(perseus_finalize(), "perseus_finalize");
  check_stale_handle_after_reinit();
  if (g_failures) return 1;
  printf("ok (%d checks)\n", g_checks);
  return 0;
}

/* A rank program for tests/comm/test_async.py: a stall. Every rank but rank 1 submits an
 * allreduce named 'lonely' and waits for it; rank 1 never submits it and instead sleeps
 * argv[1] seconds (default 7). Run with PERSEUS_STALL_CHECK_SECONDS=2 and
 * PERSEUS_STALL_SHUTDOWN_SECONDS=4: rank 0 must warn on stderr naming 'lonely' and rank 1, and
 * the submitters' wait must return PERSEUS_ERROR_TIMEOUT naming it. Afterwards every rank runs
 * one more allreduce ('after'), which must work, then a barrier, and finalizes.
 *
 * With argv[2] "deadlock", rank 1 waits in a barrier instead of sleeping, which the others never
 * enter: a deadlock, which PERSEUS_DEADLOCK_SECONDS ends by failing both 'lonely' and rank 1's
 * barrier ("rank 1: barrier returned RC: MESSAGE"). The barrier after 'after' then checks that
 * the ranks' unnamed barriers match again.
 *
 * Prints "rank R: lonely: wait returned RC: MESSAGE" on the submitters and "rank R: after: ok".
 * C99 + POSIX nanosleep; only perseus.h from Perseus. */
#define _POSIX_C_SOURCE 199309L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "perseus/perseus.h"

int main(int argc, char **argv) {
  float data[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  perseus_request_t *request = NULL;
  int rank, size, rc, i;
  if (perseus_init() != PERSEUS_SUCCESS) {
    fprintf(stderr, "init: %s\n", perseus_last_error());
    return 1;
  }
  rank = perseus_rank();
  size = perseus_size();
  if (rank == 1 && argc > 2 && strcmp(argv[2], "deadlock") == 0) {
    rc = perseus_barrier();
    printf("rank %d: barrier returned %d: %s\n", rank, rc, rc ? perseus_last_error() : "");
    fflush(stdout);
  } else if (rank == 1) {
    struct timespec pause;
    pause.tv_sec = argc > 1 ? atoi(argv[1]) : 7;
    pause.tv_nsec = 0;
    nanosleep(&pause, NULL);
  } else {
    rc = perseus_allreduce_async(data, data, 8, PERSEUS_FLOAT32, PERSEUS_SUM, 1.0, 1.0, "lonely",
                                 PERSEUS_DEVICE_CPU, NULL, &request);
    if (rc != PERSEUS_SUCCESS) {
      fprintf(stderr, "rank %d: submit: %d: %s\n", rank, rc, perseus_last_error());
      return 1;
    }
    rc = perseus_wait(request);
    printf("rank %d: lonely: wait returned %d: %s\n", rank, rc, perseus_last_error());
    fflush(stdout);
    perseus_release(request);
    for (i = 0; i < 8; ++i) data[i] = 1;
  }
  rc = perseus_allreduce(data, data, 8, PERSEUS_FLOAT32, PERSEUS_SUM, "after");
  if (rc != PERSEUS_SUCCESS) {
    fprintf(stderr, "rank %d: after: %d: %s\n", rank, rc, perseus_last_error());
    return 1;
  }
  for (i = 0; i < 8; ++i) {
    if (data[i] != (float)size) {
      printf("rank %d: after: element %d is %g, expected %d\n", rank, i, data[i], size);
      return 1;
    }
  }
  printf("rank %d: after: ok\n", rank);
  rc = perseus_barrier();
  if (rc != PERSEUS_SUCCESS) {
    fprintf(stderr, "rank %d: barrier after: %d: %s\n", rank, rc, perseus_last_error());
    return 1;
  }
  rc = perseus_finalize();
  if (rc != PERSEUS_SUCCESS) {
    fprintf(stderr, "rank %d: finalize: %d: %s\n", rank, rc, perseus_last_error());
    return 1;
  }
  return 0;
}

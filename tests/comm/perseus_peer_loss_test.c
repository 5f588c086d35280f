/* A rank program for tests/comm/test_comm.py: rank VICTIM (argv[1]) SIGKILLs itself after
 * argv[2] seconds while every rank loops over allreduces, so that it dies in the middle of one.
 * The others must not hang: each either gets an error from libperseus (printed, exit 3) or is
 * ended by perseusrun's fail-fast. With argv[3] == "ignore-sigterm" the survivors ignore
 * SIGTERM, so that only libperseus's own error can end them in time. With "hold-sockets" as
 * well, the victim first forks a child that keeps its sockets open (and ignores SIGTERM), so
 * that the survivors' connections to it never close: only libperseus's watch for ranks that
 * perseusrun saw end can free them. With "finalize" the victim instead leaves the job cleanly
 * after argv[2] rounds: perseus_finalize, then exit 0 (a script that ends early, or an
 * exception's exit-time finalize); the survivors' next allreduce must fail, naming it.
 *
 * C99 + POSIX alarm(); only perseus.h from Perseus. */
#define _POSIX_C_SOURCE 199309L

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "perseus/perseus.h"

static int hold_sockets;

static void die(int signo) {
  (void)signo;
  if (hold_sockets && fork() == 0) { /* fork, sigaction, pause: async-signal-safe */
    struct sigaction ignore;
    memset(&ignore, 0, sizeof ignore);
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGTERM, &ignore, NULL);
    for (;;) pause();
  }
  raise(SIGKILL); /* async-signal-safe; as abrupt as an OOM kill */
}

int main(int argc, char **argv) {
  enum { kCount = 1 << 18, kRounds = 1000000 };
  static float buf[kCount];
  int rank, round, rc, leave_after;
  if (argc < 3) {
    fprintf(stderr,
            "usage: perseus_peer_loss_test VICTIM SECONDS|ROUNDS "
            "[ignore-sigterm|hold-sockets|finalize]\n");
    return 2;
  }
  if (perseus_init() != PERSEUS_SUCCESS) {
    fprintf(stderr, "init: %s\n", perseus_last_error());
    return 1;
  }
  rank = perseus_rank();
  hold_sockets = argc > 3 && strcmp(argv[3], "hold-sockets") == 0;
  leave_after = argc > 3 && strcmp(argv[3], "finalize") == 0 ? atoi(argv[2]) : -1;
  if (leave_after >= 0) {
    /* only the victim's finalize ends the survivors' loop */
  } else if (rank == atoi(argv[1])) {
    signal(SIGALRM, die);
    alarm((unsigned)atoi(argv[2]));
  } else if (argc > 3 && (strcmp(argv[3], "ignore-sigterm") == 0 || hold_sockets)) {
    signal(SIGTERM, SIG_IGN);
  }
  printf("rank %d: looping\n", rank);
  fflush(stdout);
  for (round = 0; round < kRounds; ++round) {
    if (rank == atoi(argv[1]) && round == leave_after) {
      rc = perseus_finalize();
      printf("rank %d: left the job after %d rounds (finalize: %d)\n", rank, round, rc);
      return rc == PERSEUS_SUCCESS ? 0 : 4;
    }
    rc = perseus_allreduce(buf, buf, kCount, PERSEUS_FLOAT32, PERSEUS_SUM, "loop");
    if (rc != PERSEUS_SUCCESS) {
      fprintf(stderr, "rank %d: round %d: error %d: %s\n", rank, round, rc, perseus_last_error());
      return 3;
    }
  }
  fprintf(stderr, "rank %d: the victim never died\n", rank);
  return 1;
}

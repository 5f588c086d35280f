/* libperseus: the C ABI of Perseus's communication runtime.
 *
 * One C99 header, the only one a program or a framework shim includes. Every function returns
 * PERSEUS_SUCCESS (0) or a negative PERSEUS_ERROR_* code, and never lets an exception or a
 * signal through; after a failure, perseus_last_error() says what failed, with which value, and
 * what to do. Error codes are negative so that the rank queries can return either a rank or an
 * error from one int (as libusb does).
 *
 * Threading: the collectives block the calling thread until this rank's part is done. Calls
 * from several threads are serialised, but every rank must issue the same collectives in the
 * same order, so call them from one thread. perseus_last_error() is per thread.
 *
 * Memory: host memory only, for now (the NCCL backend for device memory is still to come).
 *
 * Bootstrap: start the program under perseusrun, which gives each rank its place
 * (PERSEUS_RANK, PERSEUS_SIZE, ...) and the job's rendezvous store. */
#ifndef PERSEUS_PERSEUS_H_
#define PERSEUS_PERSEUS_H_

#include <stddef.h>

#if defined(__GNUC__) || defined(__clang__)
#define PERSEUS_API __attribute__((visibility("default")))
#else
#define PERSEUS_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Results. Two kinds (docs: lib/comm/README.md):
 * - bad input (INVALID_ARGUMENT, NOT_INITIALIZED): a bug in the caller; nothing happened, fix
 *   the call.
 * - failures of the job (RENDEZVOUS, COMMUNICATION, TIMEOUT): a peer died, a host is
 *   unreachable or a wait ran out. The job cannot go on: report the message and exit non-zero,
 *   so that perseusrun ends the other ranks. */
typedef enum {
  PERSEUS_SUCCESS = 0,
  PERSEUS_ERROR_INVALID_ARGUMENT = -1, /* a dtype, op, root, pointer or count out of range */
  PERSEUS_ERROR_NOT_INITIALIZED = -2,  /* called before perseus_init or after finalize */
  PERSEUS_ERROR_RENDEZVOUS = -3,       /* the job's store could not be reached or used */
  PERSEUS_ERROR_COMMUNICATION = -4,    /* a peer was lost or a transfer failed */
  PERSEUS_ERROR_TIMEOUT = -5,          /* a wait for peers ran out (PERSEUS_*_TIMEOUT) */
  PERSEUS_ERROR_INTERNAL = -6          /* a bug in libperseus: please report it */
} perseus_result_t;

/* Element types. float16 is IEEE 754 binary16, bfloat16 the upper half of a float32. */
typedef enum {
  PERSEUS_UINT8 = 0,
  PERSEUS_INT8 = 1,
  PERSEUS_INT32 = 2,
  PERSEUS_INT64 = 3,
  PERSEUS_FLOAT16 = 4,
  PERSEUS_BFLOAT16 = 5,
  PERSEUS_FLOAT32 = 6,
  PERSEUS_FLOAT64 = 7
} perseus_dtype_t;

/* Reductions. Integer sums and products wrap around (two's complement). PERSEUS_AVERAGE is the
 * sum divided by the number of ranks; for integer types that is C's integer division (rounds
 * toward zero). float16 and bfloat16 are reduced in float32, element by element, and rounded
 * back to nearest even. */
typedef enum {
  PERSEUS_SUM = 0,
  PERSEUS_AVERAGE = 1,
  PERSEUS_MIN = 2,
  PERSEUS_MAX = 3,
  PERSEUS_PRODUCT = 4
} perseus_op_t;

/* The library's version as major * 10000 + minor * 100 + patch. */
PERSEUS_API int perseus_version(void);
/* 1 when this build has the backend, else 0. */
PERSEUS_API int perseus_gloo_built(void);
PERSEUS_API int perseus_nccl_built(void);

/* Joins the job: reads the rank's place from the environment perseusrun sets, meets the other
 * ranks through the job's rendezvous store and connects to each of them. Collective: every rank
 * must call it. Waits at most PERSEUS_INIT_TIMEOUT seconds (default 60) for the store and for
 * the peers. Calling it again while initialised does nothing; after perseus_finalize it joins
 * again (again on every rank). Sets SIGPIPE to be ignored when its action is the default, so that
 * a peer's death is reported as PERSEUS_ERROR_COMMUNICATION instead of killing this rank. */
PERSEUS_API int perseus_init(void);
/* Closes the connections. Not collective, but call it after the last collective on every rank. */
PERSEUS_API int perseus_finalize(void);

/* The rank's place: a value >= 0, or PERSEUS_ERROR_NOT_INITIALIZED before perseus_init. Local
 * means on this host; cross means among the ranks with this local rank, one per host. */
PERSEUS_API int perseus_rank(void);
PERSEUS_API int perseus_size(void);
PERSEUS_API int perseus_local_rank(void);
PERSEUS_API int perseus_local_size(void);
PERSEUS_API int perseus_cross_rank(void);
PERSEUS_API int perseus_cross_size(void);

/* Collectives. Blocking, on host memory, `count` elements of `dtype` per rank. Every rank must
 * call the same collective with the same count, dtype, op and root. count 0 is valid and moves
 * nothing (pointers may then be NULL), but is still a collective call. `name` labels the
 * operation in messages; it may be NULL. Collectives wait at most PERSEUS_COLLECTIVE_TIMEOUT
 * seconds (default 1800) for peers; a peer that dies is noticed at once. */

/* recv[i] = op over all ranks of send[i]. send may equal recv (in place); otherwise the two
 * must not overlap. */
PERSEUS_API int perseus_allreduce(const void *send, void *recv, size_t count, int dtype, int op,
                                  const char *name);
/* Every rank's buf becomes root's buf. */
PERSEUS_API int perseus_broadcast(void *buf, size_t count, int dtype, int root, const char *name);
/* recv (count * size elements) = every rank's send, in rank order. send may equal recv (the
 * input is then recv's first count elements) or recv + rank * count (the input is already in
 * place, as MPI_IN_PLACE). */
PERSEUS_API int perseus_allgather(const void *send, void *recv, size_t count, int dtype,
                                  const char *name);
/* Returns once every rank has called it. */
PERSEUS_API int perseus_barrier(void);

/* What the last failed call of this thread said: the function, the name given to it, what
 * failed with which value, and what to do. "" when none has failed. Valid until this thread's
 * next failing call. */
PERSEUS_API const char *perseus_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* PERSEUS_PERSEUS_H_ */

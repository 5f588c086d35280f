/* libperseus: the C ABI of Perseus's communication runtime.
 *
 * One C99 header, the only one a program or a framework shim includes. Every function returns
 * PERSEUS_SUCCESS (0) or a negative PERSEUS_ERROR_* code, and never lets an exception or a
 * signal through; after a failure, perseus_last_error() says what failed, with which value, and
 * what to do. Error codes are negative so that the rank queries can return either a rank or an
 * error from one int (as libusb does).
 *
 * Threading: every operation, blocking or not, is a request handed to one background thread,
 * which agrees with the other ranks on which named requests every rank has made, runs them in
 * the same order everywhere and fuses small all-reduces into one buffer (Horovod's model). So
 * ranks may submit named operations in different orders, from any thread. Blocking calls are a
 * submission and a wait. perseus_last_error() is per thread.
 *
 * Memory: host memory (device PERSEUS_DEVICE_CPU) over Gloo; CUDA device memory over NCCL when
 * perseus_nccl_built() says so.
 *
 * Bootstrap: start the program under perseusrun, which gives each rank its place
 * (PERSEUS_RANK, PERSEUS_SIZE, ...) and the job's rendezvous store; or under Open MPI's mpirun
 * (OMPI_COMM_WORLD_*) or Slurm's srun with Open MPI present, where MPI carries the rendezvous.
 *
 * Tuning (environment, read by perseus_init; what each does and its default: the table in
 * lib/comm/README.md): PERSEUS_FUSION_THRESHOLD (bytes), PERSEUS_CYCLE_TIME (ms),
 * PERSEUS_STALL_CHECK_SECONDS, PERSEUS_STALL_SHUTDOWN_SECONDS, PERSEUS_DEADLOCK_SECONDS,
 * PERSEUS_SHUTDOWN_TIMEOUT_SECONDS,
 * PERSEUS_TIMELINE (a Chrome trace file, written by rank 0), PERSEUS_INIT_TIMEOUT,
 * PERSEUS_COLLECTIVE_TIMEOUT, PERSEUS_GLOO_IFACE, PERSEUS_SHM, PERSEUS_ALLREDUCE_STREAMS,
 * PERSEUS_HIERARCHICAL_ALLREDUCE, PERSEUS_MPI_LIBRARY, PERSEUS_MPI_BOOTSTRAP_ADDR. */
#ifndef PERSEUS_PERSEUS_H_
#define PERSEUS_PERSEUS_H_

#include <stddef.h>
#include <stdint.h>

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
  PERSEUS_FLOAT64 = 7,
  PERSEUS_INT16 = 8 /* reduced on host memory only: NCCL has no 16-bit integers */
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
/* NCCL's version code (major * 10000 + minor * 100 + patch, NCCL_VERSION_CODE's form: 22809
 * for 2.28.9) when perseus_nccl_built() is 1, else 0. */
PERSEUS_API int perseus_nccl_version(void);

/* Joins the job: reads the rank's place from the environment perseusrun sets (or MPI's, under
 * Open MPI's mpirun or srun), meets the other ranks through the job's rendezvous store and
 * connects to each of them. Collective: every rank must call it. In a process that no launcher
 * started (none of perseusrun's, MPI's, Slurm's, torchrun's or horovodrun's rank variables
 * set) it makes a job of one rank, as Horovod does: rank 0 of 1, every operation gives back its
 * input, and nothing listens or connects. Some of a launcher's variables without perseusrun's
 * full set fail with PERSEUS_ERROR_RENDEZVOUS naming them. Waits at most PERSEUS_INIT_TIMEOUT
 * seconds (default 60) for the store and for the peers. Calling it again while initialised does
 * nothing; after perseus_finalize it joins again (again on every rank). Sets SIGPIPE to be ignored
 * when its action is the default, so that a peer's death is reported as PERSEUS_ERROR_COMMUNICATION
 * instead of killing this rank. */
PERSEUS_API int perseus_init(void);
/* Leaves the job, as Horovod's shutdown does: the next cycle of the background thread tells
 * every rank, and the job is then over for all of them. Operations that every rank had submitted
 * by then still run; this rank's others fail with PERSEUS_ERROR_NOT_INITIALIZED, and the other
 * ranks' pending and later operations fail with PERSEUS_ERROR_COMMUNICATION naming this rank
 * (and, under perseusrun, how it ended), so that a rank that leaves after an error never leaves
 * the others waiting. Ranks that finish normally call it at the end, in any order. Returns once
 * the background thread has stopped, or PERSEUS_ERROR_TIMEOUT when a peer did not answer within
 * PERSEUS_SHUTDOWN_TIMEOUT_SECONDS (default 30; 0: no limit), leaving the thread to the process's
 * exit (in an elastic world that perseusrun has ended, it waits 0.5 s and returns success). A
 * process that left such a thread behind ends at the start of exit() with its status, skipping
 * the exit handlers registered before (the thread would be torn down under them). A rank that
 * exits without it makes the others' pending operations fail as a lost peer. */
PERSEUS_API int perseus_finalize(void);

/* Starting without perseusrun or MPI (under torchrun, say, where the framework already has its
 * own store): one rank serves the job's rendezvous store, the caller hands its address, port
 * and secret to the other ranks by its own means (torch's store, for example), and every rank
 * joins with perseus_init_with instead of perseus_init.
 *
 * perseus_serve_rendezvous binds `bind_address` (an IPv4 or IPv6 literal the other ranks reach;
 * never a wildcard) on a free port and serves until the process exits. It writes the address
 * (NUL-terminated, at most address_size bytes), the port and a fresh 256-bit secret (32 bytes;
 * keep it off command lines and logs). */
PERSEUS_API int perseus_serve_rendezvous(const char *bind_address, char *address,
                                         size_t address_size, int *port, unsigned char secret[32]);
/* Like perseus_init, with the place and the store given instead of read from perseusrun's
 * variables (the PERSEUS_* tuning variables still apply). Collective over the `size` ranks. */
PERSEUS_API int perseus_init_with(int rank, int size, int local_rank, int local_size,
                                  int cross_rank, int cross_size, const char *rendezvous_address,
                                  int rendezvous_port, const unsigned char secret[32]);

/* The rank's place: a value >= 0, or PERSEUS_ERROR_NOT_INITIALIZED before perseus_init. Local
 * means on this host; cross means among the ranks with this local rank, one per host. */
PERSEUS_API int perseus_rank(void);
PERSEUS_API int perseus_size(void);
PERSEUS_API int perseus_local_rank(void);
PERSEUS_API int perseus_local_size(void);
PERSEUS_API int perseus_cross_rank(void);
PERSEUS_API int perseus_cross_size(void);

/* Elastic jobs (perseusrun --host-discovery-script). Each perseus_init joins the job's latest
 * world, whose place for this process perseusrun publishes; when perseusrun ends that world (a
 * rank failed, a host was lost, hosts were added), this process's operations fail with
 * PERSEUS_ERROR_COMMUNICATION, and after perseus_finalize the next perseus_init joins the next
 * world in the same process (Horovod's elastic model).
 * perseus_elastic_world: the world this process joined, or -1 outside an elastic job.
 * perseus_elastic_declare: tells perseusrun that this process can join a new world in place;
 * without that from every survivor, perseusrun restarts every process instead. A no-op outside
 * an elastic job.
 * perseus_elastic_hosts_updated: in *count, how many times perseusrun has found the discovered
 * hosts changed (0 outside an elastic job); a caller compares it with an earlier reading. */
PERSEUS_API int perseus_elastic_world(void);
PERSEUS_API int perseus_elastic_declare(void);
PERSEUS_API int perseus_elastic_hosts_updated(long long *count);

/* Blocking collectives on host memory, `count` elements of `dtype` per rank: a submission of
 * the asynchronous form below and a wait. Every rank must make the same call with the same
 * name (or NULL, see below), count, dtype, op and root. count 0 is valid and moves nothing
 * (pointers may then be NULL), but is still a collective call. A peer that dies is noticed at
 * once and named in the error. */

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

/* ---- Asynchronous named operations ------------------------------------------------------
 *
 * Each *_async call checks its arguments, hands the operation to the background thread and
 * returns at once with a request in *request; the buffers are borrowed until the request is
 * done. Every rank must submit an operation of the same name with matching arguments (dtype,
 * op, counts that fit, root); ranks may do so in any order and from any thread. A name may be
 * in flight only once per rank at a time; NULL gives "<operation>.noname.<n>", n counting this
 * process's unnamed calls of that operation (so unnamed calls must come in the same order on
 * every rank). An operation whose arguments disagree between ranks fails on every rank with an
 * error naming the ranks and values; the job goes on.
 *
 * device: PERSEUS_DEVICE_CPU for host memory, else the CUDA device ordinal the buffers live on;
 * stream: for device memory, the cudaStream_t (NULL: the legacy default stream) on which the
 * caller queued the work that produces the input; the operation starts after that work, and
 * perseus_wait makes that stream's later work wait for the result. Ignored for host memory.
 *
 * prescale/postscale multiply each input element before the reduction and each result after it
 * (1.0: none), in float64 for integers (rounded toward zero) and in float32 for 16-bit floats.
 */
#define PERSEUS_DEVICE_CPU (-1)

typedef struct perseus_request perseus_request_t;

/* recv[i] = postscale * op over ranks of (prescale * send[i]). send may equal recv. */
PERSEUS_API int perseus_allreduce_async(const void *send, void *recv, size_t count, int dtype,
                                        int op, double prescale, double postscale, const char *name,
                                        int device, void *stream, perseus_request_t **request);
PERSEUS_API int perseus_broadcast_async(void *buf, size_t count, int dtype, int root,
                                        const char *name, int device, void *stream,
                                        perseus_request_t **request);
/* Every rank's send (count elements; counts may differ between ranks), in rank order. The
 * result is held by the request: read it with perseus_output_counts and perseus_output_copy. */
PERSEUS_API int perseus_allgatherv_async(const void *send, size_t count, int dtype,
                                         const char *name, int device, void *stream,
                                         perseus_request_t **request);
/* send holds size blocks, send_counts[r] elements for rank r, one after the other. The result
 * (the blocks every rank sent to this one, in rank order) is held by the request, as for
 * allgatherv; perseus_output_counts gives what came from each rank. */
PERSEUS_API int perseus_alltoall_async(const void *send, const size_t *send_counts, int dtype,
                                       const char *name, int device, void *stream,
                                       perseus_request_t **request);
/* send holds size blocks, recv_counts[r] elements for rank r, the same recv_counts on every
 * rank; this rank's recv (recv_counts[rank] elements) = postscale * op over ranks of (prescale *
 * that rank's block number `rank`). */
PERSEUS_API int perseus_reducescatter_async(const void *send, void *recv, const size_t *recv_counts,
                                            int dtype, int op, double prescale, double postscale,
                                            const char *name, int device, void *stream,
                                            perseus_request_t **request);

/* Describes the tensor of this thread's next call (an *_async call, or its blocking form): its
 * full shape, ndims extents (0..64; ndims 0 is a scalar), whose product must be the call's
 * element count (alltoall and reducescatter: the sum of the counts). Negotiation then checks
 * it against the shapes of the other ranks that gave one: the whole shape for allreduce,
 * broadcast and reducescatter, all but the first dimension for allgatherv and alltoall (whose
 * send_counts must then be whole rows); a mismatch fails the operation on every rank with an
 * error naming both shapes. Without it only the element counts are compared. Used by that one
 * call, whatever its result, then forgotten. */
PERSEUS_API int perseus_next_shape(const int64_t *dims, int ndims);

/* 1 when the request is done (succeeded or failed), 0 while it runs, PERSEUS_ERROR_INVALID_ARGUMENT
 * for a NULL request. Never blocks. */
PERSEUS_API int perseus_poll(const perseus_request_t *request);
/* Waits until the request is done and returns its result: PERSEUS_SUCCESS or the error, whose
 * message (the operation, its name and the cause: a peer that ended, a mismatch, a stall)
 * perseus_last_error() then gives. May be called again; the request stays valid. */
PERSEUS_API int perseus_wait(perseus_request_t *request);
/* After a successful wait on an allgatherv or alltoall: counts[r] = the elements that came from
 * rank r (counts has perseus_size() entries; for an allgatherv in a process set, one per
 * member). */
PERSEUS_API int perseus_output_counts(const perseus_request_t *request, size_t *counts);
/* After a successful wait on an allgatherv or alltoall: copies the result (the sum of the
 * counts, in elements of the request's dtype) to dst, host or device memory as submitted. */
PERSEUS_API int perseus_output_copy(const perseus_request_t *request, void *dst);
/* Frees the request. A request still running is waited for first (its buffers are in use). */
PERSEUS_API void perseus_release(perseus_request_t *request);
/* perseus_wait, then perseus_release, in one call: returns the operation's result, and a
 * failure's message stays in perseus_last_error(). The request is freed either way. What a
 * framework's synchronize(handle) makes one library call instead of two. */
PERSEUS_API int perseus_wait_release(perseus_request_t *request);

/* Horovod's join: this rank has no more data. Blocks until every rank has joined; meanwhile
 * this rank takes part in the all-reduces the others submit with zeros (and in their
 * barriers), so ranks with fewer batches do not stall the rest. Other operations (broadcast,
 * allgatherv, alltoall, reducescatter) submitted while a rank has joined fail at once on the
 * ranks that submit them, naming it, as in Horovod. *last_rank (may be NULL) = the
 * last rank to join. device: where the zeros are made (PERSEUS_DEVICE_CPU or a CUDA device). */
PERSEUS_API int perseus_join(int device, int *last_rank);

/* ---- Process sets ----------------------------------------------------------------------
 *
 * A process set is a group of ranks that runs operations among themselves only (for example
 * the ranks of one host, as a synchronised batch norm's comm_scope 0 needs). Set 0,
 * PERSEUS_GLOBAL_PROCESS_SET, is every rank. Host memory only. Names are per set: the same name
 * may be in flight in two sets at once (messages show it as "name [process set N]"). */
#define PERSEUS_GLOBAL_PROCESS_SET 0

/* Collective over every rank (every rank makes the same calls in the same order, members or
 * not): makes a set of `count` distinct ranks (any order) and gives its number, the same on
 * every rank, in *process_set. The members connect among themselves now. */
PERSEUS_API int perseus_add_process_set(const int *ranks, int count, int *process_set);
/* The asynchronous operations above (and the barrier) within a process set: only its members
 * submit them, and only they take part; unnamed ones are counted per set. root is a rank of
 * the job (a member); allgatherv's result holds the members' blocks in rank order, and
 * perseus_output_counts gives one count per member. */
PERSEUS_API int perseus_allreduce_async_in(int process_set, const void *send, void *recv,
                                           size_t count, int dtype, int op, double prescale,
                                           double postscale, const char *name,
                                           perseus_request_t **request);
PERSEUS_API int perseus_broadcast_async_in(int process_set, void *buf, size_t count, int dtype,
                                           int root, const char *name, perseus_request_t **request);
PERSEUS_API int perseus_allgatherv_async_in(int process_set, const void *send, size_t count,
                                            int dtype, const char *name,
                                            perseus_request_t **request);
/* send_counts / recv_counts hold one count per member of the set, in rank order, and the
 * output counts of alltoall one per member. */
PERSEUS_API int perseus_alltoall_async_in(int process_set, const void *send,
                                          const size_t *send_counts, int dtype, const char *name,
                                          perseus_request_t **request);
PERSEUS_API int perseus_reducescatter_async_in(int process_set, const void *send, void *recv,
                                               const size_t *recv_counts, int dtype, int op,
                                               double prescale, double postscale, const char *name,
                                               perseus_request_t **request);
/* Returns once every member of the set has called it (only members call it). */
PERSEUS_API int perseus_barrier_in(int process_set);

/* ---- Communicators --------------------------------------------------------------------
 *
 * A communicator is the group of ranks a collective runs among, as a handle every
 * perseus_comm_* collective takes: perseus_comm_world gives every rank's (process set 0),
 * perseus_comm_create makes one of some ranks (a process set). The calls above without a
 * communicator are the same operations on the world, and the *_in calls the same on a set's
 * number: they stay, for one release at least, as thin wrappers. A handle belongs to the
 * perseus_init that made it: after perseus_finalize and a new perseus_init (a new world, for
 * example after an elastic restart) it is refused with PERSEUS_ERROR_INVALID_ARGUMENT, never
 * misread. Handles are never freed by the caller; there are as many as sets made. */
typedef struct perseus_comm perseus_comm_t;

/* The world: every rank of the job. */
PERSEUS_API int perseus_comm_world(perseus_comm_t **comm);
/* Collective over every rank (members or not), as perseus_add_process_set: makes a communicator
 * of `count` distinct ranks (any order), the same set on every rank. */
PERSEUS_API int perseus_comm_create(const int *ranks, int count, perseus_comm_t **comm);
/* Its process set's number (0 for the world), for the *_in calls. */
PERSEUS_API int perseus_comm_process_set(const perseus_comm_t *comm, int *process_set);
/* This rank's index among its members, in rank order (-1 when this rank is not one), and how
 * many members it has. */
PERSEUS_API int perseus_comm_rank(const perseus_comm_t *comm, int *rank);
PERSEUS_API int perseus_comm_size(const perseus_comm_t *comm, int *size);

/* The asynchronous operations above among comm's members: only members submit them. In a
 * communicator other than the world: host memory only (PERSEUS_DEVICE_CPU), root is a rank of
 * the job (a member), counts (alltoall's send counts, reducescatter's recv counts, the output
 * counts) are one per member, in rank order; unnamed operations are counted per communicator. */
PERSEUS_API int perseus_comm_allreduce_async(perseus_comm_t *comm, const void *send, void *recv,
                                             size_t count, int dtype, int op, double prescale,
                                             double postscale, const char *name, int device,
                                             void *stream, perseus_request_t **request);
PERSEUS_API int perseus_comm_broadcast_async(perseus_comm_t *comm, void *buf, size_t count,
                                             int dtype, int root, const char *name, int device,
                                             void *stream, perseus_request_t **request);
PERSEUS_API int perseus_comm_allgatherv_async(perseus_comm_t *comm, const void *send, size_t count,
                                              int dtype, const char *name, int device, void *stream,
                                              perseus_request_t **request);
PERSEUS_API int perseus_comm_alltoall_async(perseus_comm_t *comm, const void *send,
                                            const size_t *send_counts, int dtype, const char *name,
                                            int device, void *stream, perseus_request_t **request);
PERSEUS_API int perseus_comm_reducescatter_async(perseus_comm_t *comm, const void *send, void *recv,
                                                 const size_t *recv_counts, int dtype, int op,
                                                 double prescale, double postscale,
                                                 const char *name, int device, void *stream,
                                                 perseus_request_t **request);
/* An asynchronous all-reduce's arguments in one struct, for perseus_comm_allreduce_submit.
 * size must be sizeof(perseus_allreduce_args_t) (the struct's version); send .. stream are
 * perseus_comm_allreduce_async's arguments of the same names; dims holds the tensor's full
 * shape, ndims extents (0..64) whose product is count, as a perseus_next_shape right before the
 * call would give it; ndims -1: no shape (dims unused; a perseus_next_shape before applies, as
 * to perseus_comm_allreduce_async). */
typedef struct perseus_allreduce_args {
  uint32_t size;
  int32_t dtype;
  int32_t op;
  int32_t device;
  const void *send;
  void *recv;
  size_t count;
  double prescale;
  double postscale;
  void *stream;
  const int64_t *dims;
  int32_t ndims;
} perseus_allreduce_args_t;
/* perseus_comm_allreduce_async with its arguments, and the tensor's shape, in *args (read
 * before it returns): a framework's per-tensor submission in one library call, whose four
 * arguments an interpreter's foreign-function layer converts in about a third of the time of
 * fourteen (Python's ctypes: about 0.7 us less a tensor). */
PERSEUS_API int perseus_comm_allreduce_submit(perseus_comm_t *comm,
                                              const perseus_allreduce_args_t *args,
                                              const char *name, perseus_request_t **request);
/* perseus_comm_allreduce_async, waited for: submits, waits and frees the request in one call,
 * and returns the operation's result (a framework's blocking all-reduce makes one library call
 * instead of three). perseus_next_shape applies to it as to the asynchronous call. */
PERSEUS_API int perseus_comm_allreduce(perseus_comm_t *comm, const void *send, void *recv,
                                       size_t count, int dtype, int op, double prescale,
                                       double postscale, const char *name, int device,
                                       void *stream);
/* `n` all-reduces in one call: exactly what n calls of perseus_comm_allreduce_async would submit,
 * in order (tensor i: sends[i], recvs[i], counts[i] elements of dtypes[i], named names[i]; op,
 * prescale, postscale, device and stream shared), each its own request in requests[i] with its
 * own name and its own checks against the other ranks, so that one rank may submit a group
 * together while another submits it a tensor at a time. What it saves is a library call, a lock
 * and a shape call per tensor (a framework's grouped all-reduce, a bucket of gradients).
 * names: NULL (every tensor unnamed) or n names, any of them NULL. Shapes (see
 * perseus_next_shape): ndims NULL for none, else ndims[i] extents for tensor i, the extents of
 * every tensor one after the other in dims. On an error in tensor i the call returns it, naming
 * the tensor: requests[0..i-1] hold the operations submitted before it (wait for or release them
 * as usual; the other ranks take part in them), requests[i..n-1] are NULL. */
PERSEUS_API int perseus_comm_allreduce_many_async(
    perseus_comm_t *comm, int n, const void *const *sends, void *const *recvs, const size_t *counts,
    const int *dtypes, int op, double prescale, double postscale, const char *const *names,
    const int *ndims, const int64_t *dims, int device, void *stream, perseus_request_t **requests);
/* Returns once every member has called it (only members call it). */
PERSEUS_API int perseus_comm_barrier(perseus_comm_t *comm);

/* Copies n host buffers into one: srcs[i]'s bytes[i] bytes to dst, one after the other (a bucket
 * of gradients packed for one all-reduce, and its result unpacked, in one call instead of a
 * framework's copy per tensor).
 * Needs no perseus_init. PERSEUS_ERROR_INVALID_ARGUMENT, with nothing copied, when n < 0, or
 * n > 0 and srcs or bytes is NULL, or a buffer of nonzero bytes is NULL (dst among them). Host
 * memory only; the buffers must not overlap. */
PERSEUS_API int perseus_host_pack(void *dst, int n, const void *const *srcs, const size_t *bytes);
/* The reverse: src's bytes, one piece after the other, into dsts[i] (bytes[i] each). */
PERSEUS_API int perseus_host_unpack(const void *src, int n, void *const *dsts, const size_t *bytes);

/* What the last failed call of this thread said: the function, the name given to it, what
 * failed with which value, and what to do. "" when none has failed. Valid until this thread's
 * next failing call. */
PERSEUS_API const char *perseus_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* PERSEUS_PERSEUS_H_ */

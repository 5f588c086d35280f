"""The process's place in the job and what this build has: the same for every framework's shim
(perseus.torch and perseus.mxnet re-export these)."""
from perseus import _native
from perseus._process_sets import add_process_set


def init_job(comm, process_sets, shim, join=None):
    """Horovod's init(comm, process_sets) for the shim named `shim`: joins the job (`join`, or
    perseus_init), then adds process_sets (ProcessSets or lists of ranks; the same on every
    rank) in order. Collective; calling it again does nothing. `comm` is not supported."""
    if comm is not None:
        raise NotImplementedError("%s.init(comm=...): MPI communicators are not supported; the "
                                  "job is every rank perseusrun started" % shim)
    (join or _native.init)()
    if process_sets not in (None, "dynamic"):
        for ps in process_sets:
            add_process_set(ps)


def shutdown():
    """Leaves the job (perseus_finalize). Collective."""
    if _native.is_initialized():
        _native.finalize()


is_initialized = _native.is_initialized
size = _native.size
rank = _native.rank
local_size = _native.local_size
local_rank = _native.local_rank
cross_size = _native.cross_size
cross_rank = _native.cross_rank


def gloo_built():
    return _native.gloo_built()


def nccl_built():
    """As Horovod's: NCCL's version code (e.g. 22809 for 2.28.9) when NCCL can be used, else
    0 (so `if nccl_built():` and Horovod's `nccl_built() < 2700` checks both read right)."""
    return _native.nccl_version()


def cuda_built():
    return _native.nccl_built()


def mpi_built():
    return False


def mpi_enabled():
    return False


def gloo_enabled():
    return _native.gloo_built()


def mpi_threads_supported():
    return False


def ccl_built():
    return False


def ddl_built():
    return False


def rocm_built():
    return False


def is_homogeneous():
    return True

"""The process's place in the job and what this build has: the same for every framework's shim
(perseus.torch and perseus.mxnet re-export these)."""
from perseus import _native


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

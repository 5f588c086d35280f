"""How a torch process joins libperseus's job, for the Horovod API (perseus.torch.init) and the
DDP hook alike:

- libperseus joins by itself under perseusrun, Open MPI's mpirun and Slurm's srun with a process
  manager (PMI2: PMI_FD; PMIx: PMIX_RANK), and alone when no launcher's variable is set;
- otherwise, with torch's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: torchrun,
  torch.distributed.launch, Kubeflow's PyTorchJob, which sets them per pod and starts no
  launcher), it meets the other ranks through torch's own store: torch.distributed's default
  store when a process group exists, else a TCPStore at MASTER_ADDR:MASTER_PORT, served by rank 0
  (or by torchrun's agent) and shared (multi_tenant) with the script's own init_process_group.

Torch's store has no authentication, like torchrun itself: the job's secret passes through it
(perseus._native.init_through_store says so too). Imports torch only when it is called."""
import os
import socket
from datetime import timedelta

from perseus import _contract, _native

_TORCH_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_joins = [0]  # joins through a store in this process: each gets keys of its own


def joins_by_itself(environ=None):
    """True when libperseus finds its job without torch (see the module's docstring)."""
    env = os.environ if environ is None else environ
    return bool(env.get(_contract.RENDEZVOUS_ADDR) or env.get("OMPI_COMM_WORLD_SIZE")
                or (env.get("PMI_FD") and env.get("PMI_RANK")) or env.get("PMIX_RANK"))


def _torch_place(env):
    """(rank, size, master address, port) from torch's variables, or None when any is unset.
    A malformed value raises ValueError naming it."""
    if not all(env.get(name) for name in _TORCH_VARIABLES):
        return None
    values = {}
    for name in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
        try:
            values[name] = int(env[name])
        except ValueError:
            raise ValueError("%s=%r is not a number: torch's launchers set it to one"
                             % (name, env[name])) from None
    rank, size, port = values["RANK"], values["WORLD_SIZE"], values["MASTER_PORT"]
    if size < 1 or not 0 <= rank < size:
        raise ValueError("RANK=%d with WORLD_SIZE=%d: the rank must be 0 to WORLD_SIZE-1"
                         % (rank, size))
    if not 0 < port < 65536:
        raise ValueError("MASTER_PORT=%d is not a TCP port (1 to 65535)" % port)
    return rank, size, env["MASTER_ADDR"], port


def join():
    """perseus_init for this process (see the module's docstring). Collective; nothing when
    the process has joined already."""
    if _native.is_initialized():
        return None
    if joins_by_itself():
        return _native.init()
    import torch.distributed as dist
    env = os.environ
    place = _torch_place(env)
    if dist.is_available() and dist.is_initialized():
        store = dist.distributed_c10d._get_default_store()
        rank, size = dist.get_rank(), dist.get_world_size()
        master = place[2] if place else env.get("MASTER_ADDR", "127.0.0.1")
    elif place is not None and dist.is_available():
        rank, size, master, port = place
        # torchrun's agent serves the store itself; under PyTorchJob rank 0 does.
        served_by_agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        timeout = timedelta(seconds=float(env.get("PERSEUS_INIT_TIMEOUT", "60")))
        store = dist.TCPStore(master, port, size, rank == 0 and not served_by_agent, timeout,
                              multi_tenant=True)
    else:
        return _native.init()  # alone, or the launcher's variables are incomplete: it says
    _joins[0] += 1
    prefixed = dist.PrefixStore("perseus/join/%d/" % _joins[0], store)
    _native.init_through_store(prefixed, rank, size, socket.gethostbyname(master))

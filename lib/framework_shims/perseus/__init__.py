"""Perseus for Python: Horovod's API over libperseus (perseus.torch) and, by one import, plain
torch DistributedDataParallel whose gradient all-reduce goes through libperseus.

    import perseus            # first line of a DDP script: DDP's all-reduce goes through Perseus
    import perseus.torch as hvd   # or perseus.torch.horovod: Horovod's torch API

Importing this package does not import torch: the DDP hook is put in place when torch's
DistributedDataParallel module is imported (or now, if it already is). PERSEUS_DDP=0 leaves
DDP alone. See lib/framework_shims/README.md.
"""
import os

from perseus._native import PACKAGE_VERSION, NonFiniteError, PerseusError  # noqa: F401

__version__ = PACKAGE_VERSION
__all__ = ["PerseusError", "NonFiniteError", "ddp_stats", "__version__"]


def ddp_stats():
    """What the DDP hook did in this process: {"models": DDP instances that use Perseus,
    "buckets": gradient buckets all-reduced through Perseus, "compressed": those of them sent as
    float16/bfloat16 (PERSEUS_ALLREDUCE_DTYPE), "alone": those of the models in a job of one
    rank, which need no all-reduce and so get no hook (unless PERSEUS_ALLREDUCE_NANCHECK is
    set), "skipped": why it is off, or ""}."""
    from perseus import _ddp
    return dict(_ddp.STATS)


if os.environ.get("PERSEUS_DDP", "1") != "0":
    from perseus import _ddp
    _ddp.install()

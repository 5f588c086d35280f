"""Horovod's PyTorch API over libperseus: `import perseus.torch.horovod as hvd` (or
`import perseus.torch as hvd`) in place of `import horovod.torch as hvd`.

What differs from Horovod: lib/framework_shims/README.md.
"""
from perseus._native import HorovodInternalError, PerseusError  # noqa: F401
from perseus.torch.compression import Compression  # noqa: F401
from perseus.torch.functions import broadcast_optimizer_state, broadcast_parameters  # noqa: F401
from perseus.torch.ops import *  # noqa: F401,F403
from perseus.torch.ops import __all__ as _ops_all
from perseus.torch.optimizer import DistributedOptimizer  # noqa: F401
from perseus.torch.sync_batch_norm import SyncBatchNorm  # noqa: F401
from perseus.torch import elastic  # noqa: F401,I001 - last: it uses the modules above

__all__ = list(_ops_all) + ["broadcast_parameters", "broadcast_optimizer_state",
                            "DistributedOptimizer", "SyncBatchNorm", "HorovodInternalError",
                            "elastic"]

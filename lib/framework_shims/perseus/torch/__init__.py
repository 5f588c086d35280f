"""perseus.torch: Horovod's PyTorch API over libperseus (the same as perseus.torch.horovod)."""
from perseus.torch.horovod import *  # noqa: F401,F403
from perseus.torch.horovod import __all__  # noqa: F401

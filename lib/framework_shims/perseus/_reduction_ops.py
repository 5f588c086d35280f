"""Horovod's reduction constants and its rule for `op` and the deprecated `average`, the same
for every framework's shim (perseus.torch and perseus.mxnet re-export the constants)."""
from perseus import _native

# Horovod's values (horovod.common.basics), so that scripts comparing them keep working.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5

# Horovod's constant -> libperseus's perseus_op_t
LIBRARY_OPS = {Average: _native.AVERAGE, Sum: _native.SUM, Min: _native.MIN, Max: _native.MAX,
               Product: _native.PRODUCT}


def resolve_op(op, average, shim):
    """Horovod's rule: op wins; else average=False means Sum; the default is Average. `shim`
    (perseus.torch, perseus.mxnet) names the caller in the errors."""
    if op is not None and average is not None:
        raise ValueError("op and average cannot both be given (average is deprecated: use op)")
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise NotImplementedError("op=Adasum is not supported by %s "
                                  "(Average, Sum, Min, Max, Product are)" % shim)
    if op not in LIBRARY_OPS:
        raise ValueError("unknown reduction op %r" % (op,))
    return op

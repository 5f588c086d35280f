"""Options of the gradient all-reduces, read from the environment at each use (so they must be
the same on every rank: perseusrun passes its environment to every rank, or use -x):

PERSEUS_ALLREDUCE_DTYPE=fp16|bf16 (also float16, half, bfloat16; fp32, none or empty: off):
    float32 gradients are cast to that type with torch before the all-reduce and back after it,
    in the DDP hook and in DistributedOptimizer (when its `compression` argument is not given).
PERSEUS_ALLREDUCE_NANCHECK=1: after an all-reduce of a floating tensor (DDP hook,
    DistributedOptimizer, allreduce / allreduce_ / grouped_allreduce and their async forms),
    torch.isfinite(result).all(); a NaN or Inf raises perseus.NonFiniteError (a PerseusError)
    naming the tensor. The input is checked too, before it is submitted, so that the error says
    whether this rank's own input had it. Each check synchronises with the device (a debugging
    aid, not for production speed).
"""
import os

import torch

from perseus import _native

_DTYPES = {
    "": None, "0": None, "none": None, "fp32": None, "float32": None, "off": None,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
}


def allreduce_dtype():
    """torch.float16, torch.bfloat16 or None, from PERSEUS_ALLREDUCE_DTYPE."""
    value = os.environ.get("PERSEUS_ALLREDUCE_DTYPE", "").strip().lower()
    try:
        return _DTYPES[value]
    except KeyError:
        raise _native.PerseusError(
            "PERSEUS_ALLREDUCE_DTYPE=%s is not understood: use fp16 or bf16 (or fp32/none for no "
            "compression)" % os.environ.get("PERSEUS_ALLREDUCE_DTYPE"),
            _native.ERROR_INVALID_ARGUMENT) from None


_OFF = ("", "0", "no", "false", "off")
_nancheck_read = [None, False]  # the variable's last value, and what it meant: asked every call
# Asked on every all-reduce, so read from os.environ's own dict of bytes (CPython's on POSIX,
# which every assignment to or deletion from os.environ updates): 40 ns, where os.environ.get of
# a variable that is not set raises and catches a KeyError inside (half a microsecond) and the C
# library's getenv through ctypes scans the environment (240 ns). A variable set before the job
# or through os.environ is seen at the next call; one set by C code's setenv is not (as for
# every os.environ reader).
_environ = getattr(os.environ, "_data", None)
if isinstance(_environ, dict) and isinstance(next(iter(_environ), b""), bytes):
    _getenv = _environ.get
else:  # pragma: no cover - another platform's os.environ
    def _getenv(name):
        value = os.environ.get(name.decode())
        return None if value is None else value.encode()


def nancheck():
    value = _getenv(b"PERSEUS_ALLREDUCE_NANCHECK")
    read = _nancheck_read
    if value != read[0]:
        read[1] = value is not None and value.decode("utf-8", "replace").strip().lower() \
            not in _OFF
        read[0] = value
    return read[1]


def finite(tensor):
    """True unless a floating tensor holds a NaN or Inf (synchronises with its device)."""
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return True
    return bool(torch.isfinite(tensor).all())


def _kind(tensor):
    nan = bool(torch.isnan(tensor).any())
    inf = bool(torch.isinf(tensor).any())
    return "NaN and Inf" if nan and inf else ("NaN" if nan else "Inf")


def _describe(tensor):
    return "%s, shape %s, on %s" % (str(tensor.dtype).replace("torch.", ""), list(tensor.shape),
                                    tensor.device)


def nonfinite_error(label, output, input_nonfinite, sent_as=None):
    """The NonFiniteError for `label` (e.g. "parameter 'fc.weight'") whose all-reduced `output`
    is not finite; input_nonfinite: whether this rank's input (as sent) was not."""
    try:
        rank = _native.rank()
    except _native.PerseusError:
        rank = "?"
    message = "PERSEUS_ALLREDUCE_NANCHECK: %s in the all-reduced %s (%s)" % (
        _kind(output), label, _describe(output))
    if input_nonfinite:
        message += "; this rank's (rank %s) input already had it" % rank
        if sent_as is not None:
            message += " (as sent, %s)" % sent_as
    else:
        message += ("; this rank's (rank %s) input was finite: another rank's input had it, or "
                    "the reduction overflowed" % rank)
        if sent_as is not None:
            message += " in %s" % sent_as
    return _native.NonFiniteError(message, label, bool(input_nonfinite))


def bucket_bytes():
    """PERSEUS_GRADIENT_BUCKET_BYTES: the most bytes of gradients DistributedOptimizer fuses
    into one all-reduce (default 4 MiB; 0: one all-reduce per parameter, as Horovod submits)."""
    raw = os.environ.get("PERSEUS_GRADIENT_BUCKET_BYTES")
    if raw is None or raw.strip() == "":
        return 4 << 20
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        value = -1
    if value < 0:
        raise _native.PerseusError(
            "PERSEUS_GRADIENT_BUCKET_BYTES=%s is not a number of bytes: give a whole number >= 0 "
            "(0 for one all-reduce per parameter), e.g. PERSEUS_GRADIENT_BUCKET_BYTES=4194304"
            % raw, _native.ERROR_INVALID_ARGUMENT)
    return value

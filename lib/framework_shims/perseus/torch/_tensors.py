"""torch tensors as libperseus sees them: address, element count, dtype code, device, stream."""
import torch

from perseus import _native

# torch dtype -> libperseus's dtype code, of the dtypes libperseus reduces
CODES = {
    torch.uint8: _native.DTYPES["uint8"],
    torch.int8: _native.DTYPES["int8"],
    torch.int16: _native.DTYPES["int16"],
    torch.int32: _native.DTYPES["int32"],
    torch.int64: _native.DTYPES["int64"],
    torch.float16: _native.DTYPES["float16"],
    torch.bfloat16: _native.DTYPES["bfloat16"],
    torch.float32: _native.DTYPES["float32"],
    torch.float64: _native.DTYPES["float64"],
}
# Moved, never reduced: bool travels as bytes.
_BYTES = {torch.bool: _native.DTYPES["uint8"]}


def dtype_code(tensor, what, reduce=True):
    code = CODES.get(tensor.dtype)
    if code is None and not reduce:
        code = _BYTES.get(tensor.dtype)
    if code is None:
        raise _native.PerseusError(
            "%s: libperseus has no element type for %s (supported: %s)"
            % (what, tensor.dtype, ", ".join(str(t).replace("torch.", "") for t in CODES)),
            _native.ERROR_INVALID_ARGUMENT)
    return code


def describe(tensor, what, reduce=True):
    """(address, count, dtype code, device, stream) of a contiguous tensor."""
    if not tensor.is_contiguous():
        raise _native.PerseusError("%s: the tensor must be contiguous (call .contiguous())"
                                   % what, _native.ERROR_INVALID_ARGUMENT)
    code = dtype_code(tensor, what, reduce)
    if tensor.is_cpu:  # the common case first: no torch.device made
        return tensor.data_ptr(), tensor.numel(), code, _native.DEVICE_CPU, None
    if tensor.is_cuda:
        if not _native.nccl_built():
            raise _native.PerseusError(
                "%s: the tensor is on %s, but this libperseus (%s) was built without NCCL "
                "(perseus_nccl_built() = 0): move it to the CPU or use a build with NCCL"
                % (what, tensor.device, _native.library_path()), _native.ERROR_INVALID_ARGUMENT)
        device = tensor.device.index
        stream = torch.cuda.current_stream(tensor.device).cuda_stream
        return tensor.data_ptr(), tensor.numel(), code, device, stream
    raise _native.PerseusError("%s: tensors on %s are not supported (CPU and CUDA are)"
                               % (what, tensor.device), _native.ERROR_INVALID_ARGUMENT)

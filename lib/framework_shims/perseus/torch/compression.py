"""Gradient compression for allreduce and DistributedOptimizer, as Horovod's Compression."""
import torch

from perseus._compression import Compressor, NoneCompressor


class _CastCompressor(Compressor):
    """Floating-point tensors (of `sources`, or any when None) travel as `dtype` and come back
    in their own type."""

    dtype = None
    sources = None

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.dtype and (
                cls.sources is None or tensor.dtype in cls.sources):
            return tensor.to(cls.dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Floating-point tensors travel as float16 and come back in their own type (Horovod's)."""

    dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Floating-point tensors travel as bfloat16 (float32's range, 8 bits of mantissa)."""

    dtype = torch.bfloat16


class FP32ToFP16Compressor(_CastCompressor):
    """PERSEUS_ALLREDUCE_DTYPE=fp16: float32 tensors only travel as float16."""

    dtype = torch.float16
    sources = (torch.float32,)


class FP32ToBF16Compressor(_CastCompressor):
    """PERSEUS_ALLREDUCE_DTYPE=bf16: float32 tensors only travel as bfloat16."""

    dtype = torch.bfloat16
    sources = (torch.float32,)


class Compression:
    """Compression.none, Compression.fp16 (as Horovod), Compression.bf16."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def from_env():
    """The compressor PERSEUS_ALLREDUCE_DTYPE asks for (Compression.none when unset)."""
    from perseus.torch import _grad
    dtype = _grad.allreduce_dtype()
    if dtype is None:
        return NoneCompressor
    return FP32ToFP16Compressor if dtype == torch.float16 else FP32ToBF16Compressor

"""Horovod's gradient compression for MXNet: Compression.none and Compression.fp16 (float32 and
float64 gradients travel as float16 and are cast back after the all-reduce)."""
import numpy as np

from perseus._compression import Compressor, NoneCompressor  # noqa: F401 - re-exported


class FP16Compressor(Compressor):
    @staticmethod
    def compress(tensor):
        dtype = np.dtype(tensor.dtype)
        if dtype.kind == "f" and dtype.itemsize > 2:
            return tensor.astype("float16"), dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.astype(ctx)


class Compression:
    """Compression.none (the default) or Compression.fp16, for DistributedTrainer."""
    none = NoneCompressor
    fp16 = FP16Compressor

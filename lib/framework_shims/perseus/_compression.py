"""Horovod's compressor interface and its no-op compressor, the same for every framework's shim
(perseus.torch.compression and perseus.mxnet.compression add their casts)."""


class Compressor:
    """compress(tensor) -> (tensor to send, context); decompress(tensor, context) -> tensor."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends the tensor as it is (Compression.none)."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor

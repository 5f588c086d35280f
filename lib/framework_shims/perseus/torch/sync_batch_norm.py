"""SyncBatchNorm: batch normalisation with the statistics of the whole batch over every rank.

Forward (training): each rank's count, mean and spread per channel are all-gathered and
combined, so ranks may have different batch sizes. Backward: the per-channel sums of dy and
dy * (x - mean) are all-reduced; weight and bias get this rank's share of their gradient, as
every other parameter (DistributedOptimizer or DDP averages them).

Two implementations of the same arithmetic:
- CUDA tensors go through torch's own CUDA batch-norm kernels (batch_norm_stats,
  batch_norm_gather_stats_with_counts, batch_norm_elemt and their backward), the ones
  torch.nn.BatchNorm and torch.nn.SyncBatchNorm use, so the results round as torch's BatchNorm
  does over the whole batch (Horovod uses the same kernels; its tests compare with tolerance
  1e-8, which float64 statistics rounded differently can miss).
- Everything else (CPU, or a torch without those kernels) uses plain torch operations, with
  the statistics combined in float64 (Chan's parallel formula); it works on any device.
"""
import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from perseus import _native
from perseus.torch import ops


class SyncBatchNorm(_BatchNorm):
    """Drop-in for torch.nn.BatchNorm1d/2d/3d (input of 2 or more dimensions, channels second)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got %dD input)" % input.dim())

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                      else self.momentum)
        if not self.training or _native.size() == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, self.training or not self.track_running_stats,
                                factor, self.eps)
        running = (self.running_mean, self.running_var) if self.track_running_stats else None
        return _function_for(input).apply(input, self.weight, self.bias, running, factor,
                                          self.eps)


def _function_for(input):
    """The autograd function that synchronises a batch norm of `input`."""
    if input.is_cuda and _HAVE_CUDA_KERNELS:
        return _CudaSyncBatchNormFunction
    return _SyncBatchNormFunction


_HAVE_CUDA_KERNELS = all(hasattr(torch, name) for name in (
    "batch_norm_stats", "batch_norm_gather_stats_with_counts", "batch_norm_elemt",
    "batch_norm_backward_reduce", "batch_norm_backward_elemt"))


def _compute_dtype(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running, factor, eps):
        channels = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        shape = [1, channels] + [1] * (input.dim() - 2)
        x = input.to(_compute_dtype(input.dtype))
        count = input.numel() // channels if channels else 0
        if count:
            mean = x.mean(dims)
            var = x.var(dims, unbiased=False)
        else:
            mean = torch.zeros(channels, dtype=x.dtype, device=x.device)
            var = torch.zeros_like(mean)
        local = torch.cat([torch.tensor([float(count)], dtype=torch.float64, device=x.device),
                           mean.double(), var.double()]).unsqueeze(0)
        gathered = ops.allgather(local)
        counts = gathered[:, :1]
        means = gathered[:, 1:channels + 1]
        variances = gathered[:, channels + 1:]
        total = counts.sum()
        if total == 0:
            raise ValueError("SyncBatchNorm: every rank's batch is empty")
        g_mean = (counts * means).sum(0) / total
        g_var = (counts * (variances + (means - g_mean) ** 2)).sum(0) / total
        if running is not None:
            running_mean, running_var = running
            unbiased = g_var * total / (total - 1) if total > 1 else g_var
            running_mean.mul_(1 - factor).add_(g_mean.to(running_mean.dtype) * factor)
            running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype) * factor)
        mean_c = g_mean.to(x.dtype)
        invstd = torch.rsqrt(g_var + eps).to(x.dtype)
        x_hat = (x - mean_c.view(shape)) * invstd.view(shape)
        y = x_hat
        if weight is not None:
            y = y * weight.to(x.dtype).view(shape)
        if bias is not None:
            y = y + bias.to(x.dtype).view(shape)
        ctx.save_for_backward(x_hat, invstd, weight)
        ctx.total = float(total)
        ctx.has_bias = bias is not None
        ctx.input_dtype = input.dtype
        return y.to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        x_hat, invstd, weight = ctx.saved_tensors
        channels = x_hat.shape[1]
        dims = [0] + list(range(2, x_hat.dim()))
        shape = [1, channels] + [1] * (x_hat.dim() - 2)
        dy = grad_output.to(x_hat.dtype)
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * x_hat).sum(dims)
        grad_weight = sum_dy_xhat.to(weight.dtype) if weight is not None and \
            ctx.needs_input_grad[1] else None
        grad_bias = sum_dy.to(weight.dtype if weight is not None else dy.dtype) \
            if ctx.has_bias and ctx.needs_input_grad[2] else None
        grad_input = None
        if ctx.needs_input_grad[0]:
            both = ops.allreduce(torch.cat([sum_dy, sum_dy_xhat]), op=ops.Sum)
            g_sum_dy, g_sum_dy_xhat = both[:channels], both[channels:]
            scale = invstd / ctx.total
            if weight is not None:
                scale = scale * weight.to(x_hat.dtype)
            grad_input = scale.view(shape) * (ctx.total * dy - g_sum_dy.view(shape)
                                              - x_hat * g_sum_dy_xhat.view(shape))
            grad_input = grad_input.to(ctx.input_dtype)
        return grad_input, grad_weight, grad_bias, None, None, None


class _CudaSyncBatchNormFunction(torch.autograd.Function):
    """The synchronised batch norm through torch's CUDA batch-norm kernels.

    Each rank's per-channel mean, inverse standard deviation and count (one row of 2C + 1
    values in the statistics' dtype: float32 for float16/bfloat16 input) are all-gathered;
    rows of ranks with an empty batch are left out of the combination, but every rank takes
    part in both collectives so none waits for ever.
    """

    @staticmethod
    def forward(ctx, input, weight, bias, running, factor, eps):
        if not input.is_contiguous(memory_format=torch.channels_last):
            input = input.contiguous()
        if weight is not None:
            weight = weight.contiguous()
        channels = input.shape[1]
        stats_dtype = _compute_dtype(input.dtype)
        if input.numel():
            mean, invstd = torch.batch_norm_stats(input, eps)
            count = torch.full((1,), input.numel() // channels, dtype=mean.dtype,
                               device=mean.device)
            local = torch.cat([mean, invstd, count])
        else:
            local = torch.zeros(2 * channels + 1, dtype=stats_dtype, device=input.device)
        gathered = ops.allgather(local.unsqueeze(0))
        means, invstds, counts = torch.split(gathered, channels, dim=1)
        present = counts.squeeze(1) >= 1
        if not bool(present.any()):
            raise ValueError("SyncBatchNorm: every rank's batch is empty")
        means, invstds, counts = means[present], invstds[present], counts[present]
        running_mean, running_var = running if running is not None else (None, None)
        # The kernel reads the counts in the running statistics' dtype (else the input's): a
        # float16 model's BatchNorm keeps float16 running statistics.
        count_dtype = running_mean.dtype if running_mean is not None else input.dtype
        mean, invstd = torch.batch_norm_gather_stats_with_counts(
            input, means, invstds, running_mean, running_var, factor, eps,
            counts.view(-1).to(count_dtype))
        ctx.save_for_backward(input, weight, mean, invstd, counts.to(torch.int32))
        ctx.has_bias = bias is not None
        if not input.numel():
            return torch.empty_like(input)
        return torch.batch_norm_elemt(input, weight, bias, mean, invstd, eps)

    @staticmethod
    def backward(ctx, grad_output):
        if not grad_output.is_contiguous(memory_format=torch.channels_last):
            grad_output = grad_output.contiguous()
        input, weight, mean, invstd, counts = ctx.saved_tensors
        channels = input.shape[1]
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_input = grad_weight = grad_bias = None
        if input.numel():
            sum_dy, sum_dy_xmu, grad_weight, grad_bias = torch.batch_norm_backward_reduce(
                grad_output, input, mean, invstd, weight, need_input,
                need_weight and weight is not None, need_bias and ctx.has_bias)
            if need_input:
                both = ops.allreduce(torch.cat([sum_dy, sum_dy_xmu]), op=ops.Sum)
                sum_dy, sum_dy_xmu = both[:channels], both[channels:]
                # The kernel takes the weight in the statistics' dtype (float32 for a float16
                # model's BatchNorm).
                grad_input = torch.batch_norm_backward_elemt(
                    grad_output, input, mean, invstd,
                    weight.to(mean.dtype) if weight is not None else None, sum_dy, sum_dy_xmu,
                    counts)
        elif need_input:
            # An empty batch still takes part in the all-reduce its peers wait for.
            ops.allreduce(torch.zeros(2 * channels, dtype=mean.dtype, device=input.device),
                          op=ops.Sum)
            grad_input = torch.zeros_like(input)
        if weight is None or not need_weight:
            grad_weight = None
        elif grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if not ctx.has_bias or not need_bias:
            grad_bias = None
        elif grad_bias is not None and weight is not None:
            grad_bias = grad_bias.to(weight.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None

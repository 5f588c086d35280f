"""SyncBatchNorm: batch normalisation with the statistics of the whole batch over every rank.

Forward (training): each rank's count, mean and biased variance per channel are all-gathered
and combined (Chan's parallel formula), so ranks may have different batch sizes. Backward: the
per-channel sums of dy and dy * x_hat are all-reduced; weight and bias get this rank's share
of their gradient, as every other parameter (DistributedOptimizer or DDP averages them).
Plain torch operations only, so it works on any torch version and device.
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
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, running, factor,
                                            self.eps)


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

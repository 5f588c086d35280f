# _foreach_copy_ against perseus_host_pack for a CPU bucket of the 200-tensor model's gradients,
# each timed alone (timeit, 500 calls, best of 7): run with PYTHONPATH=lib/framework_shims under
# a torch >= 2.1 (torch._foreach_copy_) and a built libperseus.
import timeit, torch, sys, statistics
torch.set_num_threads(1)
from perseus.torch import _buckets
from torch._utils import _unflatten_dense_tensors
params=[]
for _ in range(100): params += [torch.zeros(32,32), torch.zeros(32)]
grads=[torch.randn_like(p) for p in params]
b=_buckets.Bucket(params,"b"); b.flatten(grads)
g=dict(b=b,grads=grads,torch=torch,_buckets=_buckets)
print(sys.version.split()[0], torch.__version__)
for s in ["torch._foreach_copy_(b.views, grads)","b.flatten(grads)","_buckets._host_pieces(b.buffer, grads)","torch._foreach_copy_(grads, b.views)","b.scatter(b.buffer, grads)"]:
    print("%-45s %7.1f us"%(s,min(timeit.repeat(s,globals=g,number=500,repeat=7))/500*1e6))

# 1000 x 4 KB allreduce_async_ then synchronize, 20 warm-up rounds, 200 timed (a barrier
# before each); prints rank 0's median wall time and the CPU time per round of its busiest
# threads (the Python thread and the engine). Run under perseusrun -np 2 with PYTHONPATH at
# the tree to measure.
import time, statistics, torch, os, sys
import perseus.torch.horovod as hvd
torch.set_num_threads(1)
hvd.init()
ts=[torch.ones(1024) for _ in range(1000)]
names=["a.%d"%i for i in range(1000)]
def cpu():
    out={}
    for tid in os.listdir("/proc/self/task"):
        f=open("/proc/self/task/%s/stat"%tid).read().rsplit(")",1)[1].split()
        out[tid]=(int(f[11])+int(f[12]))
    return out
def rnd():
    hs=[hvd.allreduce_async_(t,name=n,op=hvd.Sum) for t,n in zip(ts,names)]
    for h in hs: hvd.synchronize(h)
for _ in range(20): rnd()
walls=[]
c0=cpu()
for r in range(200):
    hvd.barrier()
    s=time.perf_counter(); rnd(); walls.append((time.perf_counter()-s)*1e3)
c1=cpu()
tick=os.sysconf("SC_CLK_TCK")
d=sorted(((c1[k]-c0.get(k,0))*1000/tick/200, k) for k in c1)
if hvd.rank()==0:
    print("wall median %.2f ms; cpu ms/round by thread: %s"%(statistics.median(walls), ", ".join("%.2f"%x for x,_ in d[-3:])))
hvd.shutdown()

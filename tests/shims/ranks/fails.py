"""A rank that fails the way training scripts fail, while the others wait in a collective.

    fails.py API HOW DIR

API: hvd (perseus.torch.horovod), grouped (its grouped_allreduce of host tensors, one library
call a group), ddp (import perseus + DistributedDataParallel under
torch.distributed), mxnet (perseus.mxnet), flood (no collectives: output without end). HOW, done by the job's last rank after a few steps:
raise (an uncaught RuntimeError), exit3 (sys.exit(3)), exit0 (sys.exit(0): it leaves the job
without an error, so the others' collectives must fail), kill (SIGKILL, as the OOM killer). The other ranks go on calling
collectives; each writes DIR/error.<rank> with what their failed collective said. The failing
rank writes DIR/failed_at (time.time()) just before it fails, for the test to time the end.
"""
import os
import signal
import sys
import time

API, HOW, DIR = sys.argv[1], sys.argv[2], sys.argv[3]
STEPS_BEFORE = 3


def rank_and_size():
    for rank, size in (("PERSEUS_RANK", "PERSEUS_SIZE"), ("OMPI_COMM_WORLD_RANK",
                                                         "OMPI_COMM_WORLD_SIZE"),
                       ("RANK", "WORLD_SIZE")):
        if rank in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    raise SystemExit("fails.py: no launcher's rank variables")


def fail_now():
    with open(os.path.join(DIR, "failed_at.tmp"), "w") as f:
        f.write(repr(time.time()))
    os.rename(os.path.join(DIR, "failed_at.tmp"), os.path.join(DIR, "failed_at"))
    if HOW == "raise":
        raise RuntimeError("a bad batch at step %d" % STEPS_BEFORE)
    if HOW == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(HOW[len("exit"):]))


def run_steps(step):
    """Calls step(i) until the failing rank fails; the others record their error."""
    rank, size = rank_and_size()
    try:
        for i in range(10 ** 6):
            if rank == size - 1 and i == STEPS_BEFORE:
                fail_now()
            step(i)
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - the test reads what it says
        if rank != size - 1:
            with open(os.path.join(DIR, "error.%d" % rank), "w") as f:
                f.write("%s: %s" % (type(e).__name__, e))
        raise


if API == "flood":
    # No collectives: every rank writes output as fast as it can (for a reader that has stopped
    # reading); the last rank fails 2 s in, from an alarm, even while blocked in a write.
    rank, size = rank_and_size()
    if rank == size - 1:
        signal.signal(signal.SIGALRM, lambda *_: fail_now())
        signal.alarm(2)
    line = "x" * 1023 + "\n"
    while True:
        sys.stdout.write(line)
elif API == "hvd":
    import torch
    import perseus.torch.horovod as hvd
    hvd.init()
    run_steps(lambda i: hvd.allreduce(torch.ones(1000, 3), name="x%d" % i))
elif API == "grouped":
    import torch
    import perseus.torch.horovod as hvd
    hvd.init()
    run_steps(lambda i: hvd.grouped_allreduce([torch.ones(1000, 3), torch.ones(17, 17, 17)],
                                              name="g%d" % i))
elif API == "ddp":
    import perseus  # noqa: F401 - sends DDP's gradient all-reduce through libperseus
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(7, 3))
    run_steps(lambda i: model(torch.ones(5, 7)).sum().backward())
elif API == "mxnet":
    import mxnet as mx
    import perseus.mxnet as hvd
    hvd.init()
    run_steps(lambda i: hvd.allreduce(mx.nd.ones((1000, 3)), name="x%d" % i).wait_to_read())
else:
    raise SystemExit("fails.py: unknown API %r" % API)

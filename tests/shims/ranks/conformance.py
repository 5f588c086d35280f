"""Horovod's documented semantics where perseus.torch used to differ (issue 22): whatever shapes
the peers send, every rank raises an error naming both shapes and the next operation works; a
name still in flight raises ValueError at once; join with a pending allgather or broadcast
raises on the others and returns the last rank to join; gradients of allgather and broadcast
are averaged; int16 travels; a deadlock (rank 0 in a barrier, the others in an allreduce)
raises on every rank, naming both, and the job goes on (run with PERSEUS_DEADLOCK_SECONDS=2)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import perseus.torch.horovod as hvd  # noqa: E402
from common import Checks, run  # noqa: E402


def refused_everywhere(check, fn, what, contains):
    check.raises(hvd.PerseusError, fn, what, contains=contains)


def next_works(check, what):
    """After a refused operation the job goes on: an allreduce and an allgather still work."""
    n, me = hvd.size(), hvd.rank()
    total = hvd.allreduce(torch.full((3,), float(me)), op=hvd.Sum)
    check(total.tolist() == [float(sum(range(n)))] * 3, "%s: the next allreduce" % what)
    gathered = hvd.allgather(torch.full((me + 1, 2), me, dtype=torch.int64))
    want = torch.cat([torch.full((r + 1, 2), r, dtype=torch.int64) for r in range(n)])
    check(torch.equal(gathered, want), "%s: the next allgather" % what)


def shapes(check):
    n, me = hvd.size(), hvd.rank()
    # allgather: the non-first dimensions differ between ranks (used to corrupt memory).
    refused_everywhere(check, lambda: hvd.allgather(torch.ones(2, 3 + me)),
                       "allgather of rows of different sizes",
                       ["shape", "rank 0 gave [*, 3]", "rank 1 [*, 4]"])
    next_works(check, "allgather rows")
    # allgather: the ranks' tensors have different numbers of dimensions, equal row sizes.
    shape = (2, 6) if me == 0 else (2, 6, 1)
    refused_everywhere(check, lambda: hvd.allgather(torch.ones(shape)),
                       "allgather of different numbers of dimensions",
                       ["shape", "rank 0 gave [*, 6]", "rank 1 [*, 6, 1]"])
    next_works(check, "allgather dimensions")
    # alltoall: rows of different sizes, whole splits that fit each rank's own tensor.
    refused_everywhere(check, lambda: hvd.alltoall(torch.ones(n, 2 + me)),
                       "alltoall of rows of different sizes",
                       ["shape", "rank 0 gave [*, 2]", "rank 1 [*, 3]"])
    next_works(check, "alltoall rows")
    # allreduce, reducescatter, broadcast: equal element counts, different shapes.
    shape = (n, 6) if me == 0 else (6, n)
    for what, fn in [
            ("allreduce", lambda: hvd.allreduce(torch.ones(shape), op=hvd.Sum)),
            ("reducescatter", lambda: hvd.reducescatter(torch.ones(shape), op=hvd.Sum)),
            ("broadcast", lambda: hvd.broadcast(torch.ones(shape), 0))]:
        refused_everywhere(check, fn, "%s of equal counts, different shapes" % what,
                           ["shape", "rank 0 gave [%d, 6]" % n, "rank 1 [6, %d]" % n])
        next_works(check, what)


def duplicate_names(check):
    n, me = hvd.size(), hvd.rank()
    t = torch.ones(4, 3)
    submits = {
        "allreduce": lambda name: hvd.allreduce_async(t, name=name),
        "allgather": lambda name: hvd.allgather_async(t, name=name),
        "broadcast": lambda name: hvd.broadcast_async(t, 0, name=name),
        "reducescatter": lambda name: hvd.reducescatter_async(torch.ones(n, 3), name=name),
    }
    for what, submit in submits.items():
        name = "duplicate." + what
        # As in Horovod's own check: rank 0 submits first and drops its handle, while the
        # others wait at the barrier; the second submission raises at once.
        if me == 0:
            submit(name)
            check.raises(ValueError, lambda: submit(name), "%s: second '%s' on rank 0"
                         % (what, name), contains=["already in flight"])
        hvd.barrier()
        if me > 0:
            handle = submit(name)
            check.raises(ValueError, lambda: submit(name), "%s: second '%s' on rank %d"
                         % (what, name, me), contains=["already in flight"])
            hvd.synchronize(handle)
        next_works(check, "after a duplicate " + what)
    # A blocking all-reduce (one library call for a host tensor) under a name in flight raises
    # at once too; once the handle is synchronized the name works again.
    handle = hvd.allreduce_async(t, name="duplicate.blocking")
    for what, fn in [
            ("allreduce_", lambda: hvd.allreduce_(t.clone(), name="duplicate.blocking")),
            ("allreduce", lambda: hvd.allreduce(t, name="duplicate.blocking"))]:
        check.raises(ValueError, fn, "blocking %s under a name in flight" % what,
                     contains=["duplicate.blocking", "already in flight"])
    hvd.synchronize(handle)
    again = hvd.allreduce_(t.clone(), name="duplicate.blocking", op=hvd.Sum)
    check(torch.equal(again, t * n), "a blocking allreduce_ under the name once it is free")
    # As Horovod's own tests write it, every rank drops its first handle: the second
    # submission must raise even when the first has already finished (the other ranks were
    # waiting for it), so many rounds, each its own name.
    for what, submit in submits.items():
        for round_ in range(10):
            name = "dropped.%s.%d" % (what, round_)
            if me == 0:
                submit(name)
                check.raises(ValueError, lambda: submit(name), "%s: second '%s' on rank 0"
                             % (what, name), contains=["already in flight"])
            hvd.barrier()
            if me > 0:
                submit(name)
                check.raises(ValueError, lambda: submit(name), "%s: second '%s' on rank %d"
                             % (what, name, me), contains=["already in flight"])
            hvd.barrier()
        next_works(check, "after dropped duplicates of " + what)
        # Once a submission under another name has found the dropped one done, the name is free.
        again = hvd.synchronize(submit(name))
        check(again is not None, "%s: '%s' again after it ended" % (what, name))


def join(check):
    n, me = hvd.size(), hvd.rank()
    for op in ["allgather", "broadcast"]:
        for first in range(n):
            if me == first:
                last = hvd.join()
            else:
                fn = (lambda: hvd.allgather(torch.ones(2, 2))) if op == "allgather" else \
                    (lambda: hvd.broadcast(torch.ones(2, 2), me, name="join.broadcast"))
                check.raises(RuntimeError, fn, "%s while rank %d has joined" % (op, first),
                             contains=["has joined"])
                last = hvd.join()
            check(last != first, "%s: join returned the first rank to join (%d)" % (op, first))
            everyone = hvd.allgather_object(last)
            check(everyone == [last] * n, "%s: join's last rank differs: %s" % (op, everyone))
    next_works(check, "after join")


def gradients(check):
    n, me = hvd.size(), hvd.rank()
    # broadcast: the root's gradient is the ranks' average (1 for a loss of sum), others 0.
    x = torch.ones(3, requires_grad=True)
    hvd.broadcast(x, 0).sum().backward()
    want = 1.0 if me == 0 else 0.0
    check(x.grad.tolist() == [want] * 3, "broadcast gradient: %s, want %s" % (x.grad, want))
    # allgather: this rank's rows of the ranks' average gradient.
    x = torch.ones(me + 1, 2, requires_grad=True)
    y = hvd.allgather(x)
    weights = torch.arange(y.shape[0] * 2, dtype=torch.float32).reshape(y.shape)
    (y * weights * (me + 1)).sum().backward()
    mean_factor = sum(r + 1 for r in range(n)) / n
    start = sum(r + 1 for r in range(me))
    want = weights[start:start + me + 1] * mean_factor
    check.close(x.grad, want, "allgather gradient")


def int16(check):
    n, me = hvd.size(), hvd.rank()
    t = torch.arange(6, dtype=torch.int16).reshape(2, 3) + 1000 * me
    gathered = hvd.allgather(t)
    check(gathered.dtype == torch.int16 and torch.equal(
        gathered, torch.cat([torch.arange(6, dtype=torch.int16).reshape(2, 3) + 1000 * r
                             for r in range(n)])), "int16 allgather")
    b = hvd.broadcast(t, n - 1)
    check(torch.equal(b, torch.arange(6, dtype=torch.int16).reshape(2, 3) + 1000 * (n - 1)),
          "int16 broadcast")
    a = hvd.alltoall(torch.full((n, 2), me, dtype=torch.int16))
    check(torch.equal(a, torch.arange(n, dtype=torch.int16).repeat_interleave(2).reshape(n, 2)),
          "int16 alltoall")
    s = hvd.allreduce(t, op=hvd.Sum)
    want = sum(torch.arange(6, dtype=torch.int64).reshape(2, 3) + 1000 * r for r in range(n))
    check(s.dtype == torch.int16 and torch.equal(s, want.to(torch.int16)), "int16 allreduce")
    m = hvd.allreduce(t, op=hvd.Max)
    check(torch.equal(m, t - 1000 * me + 1000 * (n - 1)), "int16 max")


def deadlock(check):
    # What Horovod's test_torch.py does when one rank's assertion fails: its tearDown calls
    # barrier() while the others are already in the next collective. Horovod hangs there.
    n, me = hvd.size(), hvd.rank()
    if me == 0:
        fn, what = hvd.barrier, "barrier while the others allreduce"
    else:
        fn, what = (lambda: hvd.allreduce(torch.ones(5), op=hvd.Sum)), "allreduce while rank 0 " \
            "is in a barrier"
    check.raises(hvd.PerseusError, fn, what,
                 contains=["deadlock", "barrier 'barrier.noname.", "never by ranks 0)",
                           "allreduce 'allreduce.noname."])
    next_works(check, "after a deadlock")
    # The unnamed operations' numbers match again: the barrier and the allreduce run.
    hvd.barrier()
    total = hvd.allreduce(torch.ones(2), op=hvd.Sum)
    check(total.tolist() == [float(n)] * 2, "unnamed allreduce after a deadlock: %s" % total)


def main():
    check = Checks("conformance")
    hvd.init()
    shapes(check)
    duplicate_names(check)
    join(check)
    gradients(check)
    deadlock(check)
    if os.environ.get("CONFORMANCE_INT16", "1") == "1":
        int16(check)
    check.finish()
    hvd.shutdown()


run(main)

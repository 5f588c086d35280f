"""grouped_allreduce of host tensors, which perseus.torch submits in one library call
(perseus_comm_allreduce_many_async), against the same tensors all-reduced one call each: every
dtype, odd shapes (3-D and empty among them), every op, scale factors, in place and not, named
and unnamed, in a process set; one rank on the one-call-a-tensor path (its NaN check on) while
the others take the one-call path; and the misuse a group can carry: a name in flight twice, a
shape or dtype that differs on one rank (raised again at a second synchronize), a tensor that
is not contiguous, a group dropped unsynchronized (its names free once it has ended).

    perseusrun -np N python grouped.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import perseus.torch.horovod as hvd  # noqa: E402
from common import Checks, run  # noqa: E402
from perseus.torch.ops import DuplicateNameError  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
          torch.int16, torch.int32, torch.int64]
SHAPES = [(1,), (7,), (3, 5), (13, 1, 3), (0, 4), (2, 3, 4), (17, 17, 17)]
OPS = [("sum", hvd.Sum), ("avg", hvd.Average), ("min", hvd.Min), ("max", hvd.Max),
       ("prod", hvd.Product)]


def data(r, shape, dtype, salt, op):
    """Small integers (exact in every dtype, so that sums and products do not depend on the
    order of the reduction); Average's are multiples of the ranks' count."""
    g = torch.Generator().manual_seed(1000 * r + salt)
    low, high = (1, 3) if op == hvd.Product else (-4, 5)
    if dtype == torch.uint8:
        low = max(low, 0)
    values = torch.randint(low, high, shape, generator=g, dtype=torch.int64)
    if op == hvd.Average:
        values = values * hvd.size()
    return values.to(dtype)


def same(check, got, want, what):
    ok = got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    check(ok, "%s: got %s %s %s, expected %s %s %s" % (
        what, got.dtype, tuple(got.shape), got.flatten()[:6].tolist(), want.dtype,
        tuple(want.shape), want.flatten()[:6].tolist()))


def every_kind(check, me):
    for dtype in DTYPES:
        for label, op in OPS:
            tag = "%s %s" % (str(dtype).replace("torch.", ""), label)
            salt = DTYPES.index(dtype) * 10 + OPS.index((label, op))
            tensors = [data(me, shape, dtype, salt + 100 * i, op) for i, shape in enumerate(SHAPES)]
            one_each = [hvd.allreduce(t, op=op, name="one.%s.%d" % (tag, i))
                        for i, t in enumerate(tensors)]
            # Each tensor's Sum, against what every rank contributed (the rank knows the seeds).
            if op == hvd.Sum:
                for i, shape in enumerate(SHAPES):
                    want = sum(data(r, shape, dtype, salt + 100 * i, op).double()
                               for r in range(hvd.size())).to(dtype)
                    same(check, one_each[i], want, "allreduce sum %s tensor %d" % (tag, i))
            grouped = hvd.grouped_allreduce(tensors, op=op, name="grouped." + tag)
            for i in range(len(SHAPES)):
                same(check, grouped[i], one_each[i], "grouped_allreduce %s tensor %d" % (tag, i))
            copies = [t.clone() for t in tensors]
            addresses = [c.data_ptr() for c in copies]
            outs = hvd.synchronize(hvd.grouped_allreduce_async_(copies, op=op))  # unnamed
            for i in range(len(SHAPES)):
                same(check, copies[i], one_each[i], "grouped_allreduce_ %s tensor %d" % (tag, i))
            check([o.data_ptr() for o in outs] == addresses and
                  [c.data_ptr() for c in copies] == addresses, "grouped_allreduce_ in place " + tag)
        if dtype.is_floating_point:
            tensors = [data(me, shape, dtype, 7 + i, hvd.Sum) for i, shape in enumerate(SHAPES)]
            for label, op in (("sum", hvd.Sum), ("avg", hvd.Average)):
                kwargs = {"prescale_factor": 0.5, "postscale_factor": 4.0}
                one_each = [hvd.allreduce(t, op=op, name="scaled.%s.%s.%d" % (dtype, label, i),
                                          **kwargs) for i, t in enumerate(tensors)]
                grouped = hvd.grouped_allreduce(tensors, op=op, name="gscaled.%s.%s" % (
                    dtype, label), **kwargs)
                for i in range(len(SHAPES)):
                    same(check, grouped[i], one_each[i],
                         "grouped_allreduce %s %s with scale factors, tensor %d"
                         % (dtype, label, i))


def main():
    check = Checks("grouped")
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    every_kind(check, me)

    # One rank goes a tensor at a time (the NaN check keeps it off the one-call path); the
    # requests are the same, so the group still meets.
    os.environ["PERSEUS_ALLREDUCE_NANCHECK"] = "1" if me == 0 else "0"
    tensors = [data(me, shape, torch.float32, 50 + i, hvd.Sum) for i, shape in enumerate(SHAPES)]
    want = [sum(data(r, shape, torch.float32, 50 + i, hvd.Sum) for r in range(n))
            for i, shape in enumerate(SHAPES)]
    for round_ in range(2):  # the second round on the negotiation's cached path
        got = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="mixed")
        for i in range(len(SHAPES)):
            same(check, got[i], want[i], "mixed paths, round %d, tensor %d" % (round_, i))
    os.environ.pop("PERSEUS_ALLREDUCE_NANCHECK")

    # A process set of ranks 0 and n - 1.
    members = sorted({0, n - 1})
    ps = hvd.add_process_set(members)
    if me in members:
        got = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="in_set", process_set=ps)
        wrong = [i for i, shape in enumerate(SHAPES) if not torch.equal(
            got[i], sum(data(r, shape, torch.float32, 50 + i, hvd.Sum) for r in members))]
        check(not wrong, "grouped_allreduce in set %s: tensors %s differ" % (members, wrong))
    else:  # (one check on every rank: the ranks' counts of checks are compared)
        check.raises(hvd.PerseusError, lambda: hvd.grouped_allreduce(tensors, process_set=ps),
                     "a group in a set this rank is not in", ["not a member"])
    hvd.remove_process_set(ps)

    # Misuse: every rank gets the error, and the job goes on.
    first = hvd.grouped_allreduce_async(tensors, name="twice")
    check.raises(DuplicateNameError,
                 lambda: hvd.grouped_allreduce_async(tensors, name="twice"),
                 "a group's name in flight twice", ["twice.0", "synchronize its handle first"])
    hvd.synchronize(first)
    if n > 1:
        skewed = [t.clone() for t in tensors]
        if me == n - 1:
            skewed[2] = skewed[2].reshape(5, 3)
        check.raises(hvd.PerseusError, lambda: hvd.grouped_allreduce(skewed, name="skewed"),
                     "a shape that differs on rank %d" % (n - 1), ["[3, 5]", "[5, 3]"])
        # In place and asynchronously, under the same names (free again): synchronize raises
        # once every tensor of the group has ended, the tensors that agreed are reduced, and
        # the names are free at once for the next group.
        inplace = [t.clone() for t in skewed]
        handle = hvd.grouped_allreduce_async_(inplace, name="skewed", op=hvd.Sum)
        check.raises(hvd.PerseusError, lambda: hvd.synchronize(handle),
                     "in place, a shape that differs on rank %d" % (n - 1), ["[3, 5]", "[5, 3]"])
        for i in range(len(SHAPES)):
            if i != 2:
                same(check, inplace[i], want[i], "in place, tensor %d beside the failure" % i)
        check(hvd.poll(handle), "a failed group polls done")
        check.raises(hvd.PerseusError, lambda: hvd.synchronize(handle),
                     "the same failure at a second synchronize", ["skewed.2", "[3, 5]"])
        again = [t.clone() for t in tensors]
        hvd.synchronize(hvd.grouped_allreduce_async_(again, name="skewed", op=hvd.Sum))
        for i in range(len(SHAPES)):
            same(check, again[i], want[i], "the names free after the failure, tensor %d" % i)
        typed = [t.clone() for t in tensors]
        if me == n - 1:
            typed[1] = typed[1].double()
        check.raises(hvd.PerseusError, lambda: hvd.grouped_allreduce(typed, name="typed"),
                     "a dtype that differs on rank %d" % (n - 1), ["float32", "float64"])
    # A group dropped before it is synchronized: its requests are released, and its names freed,
    # once done (at a later submission), so the same names serve the next group.
    dropped = hvd.grouped_allreduce_async([t.clone() for t in tensors], name="dropped")
    del dropped
    hvd.barrier()  # every rank has submitted the dropped group: it ends
    hvd.allreduce(torch.ones(3), name="after_drop")  # a submission releases what has ended
    got = hvd.synchronize(hvd.grouped_allreduce_async(tensors, op=hvd.Sum, name="dropped"))
    for i in range(len(SHAPES)):
        same(check, got[i], want[i], "the names of a dropped group reused, tensor %d" % i)
    strided = [tensors[0], torch.zeros(4, 6)[:, ::2]]
    check.raises(hvd.PerseusError, lambda: hvd.grouped_allreduce_(strided, name="strided"),
                 "a tensor that is not contiguous, in place", ["contiguous"])
    after = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="after")
    for i in range(len(SHAPES)):
        same(check, after[i], want[i], "after the errors, tensor %d" % i)
    hvd.shutdown()
    check.finish()


if __name__ == "__main__":
    run(main)

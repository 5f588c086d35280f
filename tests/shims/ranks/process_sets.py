"""perseus.torch's process sets (Horovod's add_process_set / process_set=) against references
each rank computes itself: the even ranks and the odd ranks make two sets ({0, 2} and {1} with 3
ranks); every operation (all-reduce, allgather, broadcast, alltoall, reducescatter: plain, in
place, async, grouped, autograd; barrier, the object collectives, DistributedOptimizer) runs
within each, with global operations in between and the same names in flight in both, and a
rank outside a set is refused."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import perseus.torch.horovod as hvd  # noqa: E402
from common import Checks, run  # noqa: E402


def data(r, shape, dtype=torch.float32, salt=0):
    g = torch.Generator().manual_seed(1000 * r + salt)
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    return torch.randint(-4, 5, shape, generator=g, dtype=torch.int64).to(dtype)


def more_in_sets(check, n, me, mine, members):
    """alltoall, reducescatter (plain, grouped, autograd), barrier, the object collectives,
    unnamed operations and DistributedOptimizer within each set."""
    m, pos = len(members), members.index(me)
    for dtype in (torch.float32, torch.int64, torch.float16):
        # alltoall: member i sends i + j + 1 rows of shape (2, 3) to member j.
        sent = {r: data(r, ((members.index(r) + 1) * m + sum(range(m)), 2, 3), dtype, 30)
                for r in members}

        def block(r, j):
            i = members.index(r)
            start = sum(i + k + 1 for k in range(j))
            return sent[r][start:start + i + j + 1]
        splits = [pos + j + 1 for j in range(m)]
        out, received = hvd.alltoall(sent[me], splits=splits, name="a2a.%s" % dtype,
                                     process_set=mine)
        check.close(out, torch.cat([block(r, pos) for r in members]), "set alltoall %s" % dtype)
        check(received.tolist() == [members.index(r) + pos + 1 for r in members],
              "set alltoall received_splits %s" % received.tolist())
        even = data(me, (3 * m,), dtype, 31)
        check.close(hvd.alltoall(even, process_set=mine),
                    torch.cat([data(r, (3 * m,), dtype, 31)[3 * pos:3 * pos + 3] for r in members]),
                    "set alltoall, equal splits, unnamed %s" % dtype)

        # reducescatter: 2 * m + 1 rows (the first member gets one more), 3-D.
        rows = 2 * m + 1
        x = data(me, (rows, 2, 2), dtype, 32)
        total = sum(data(r, (rows, 2, 2), dtype, 32).double() for r in members)
        share = [rows // m + (1 if i < rows % m else 0) for i in range(m)]
        start = sum(share[:pos])
        mine_sum = total[start:start + share[pos]]
        check.close(hvd.reducescatter(x, op=hvd.Sum, name="rs.%s" % dtype, process_set=mine),
                    mine_sum.to(dtype), "set reducescatter Sum %s" % dtype, rtol=1e-3)
        outs = hvd.grouped_reducescatter([x, x + 1], op=hvd.Sum, name="grs.%s" % dtype,
                                         process_set=mine)
        check.close(outs[0], mine_sum.to(dtype), "set grouped_reducescatter 0", rtol=1e-3)
        check.close(outs[1], (mine_sum + m).to(dtype), "set grouped_reducescatter 1", rtol=1e-3)
    x = data(me, (2 * m + 1, 3), torch.float64, 33)
    check.close(hvd.synchronize(hvd.reducescatter_async(x, name="rs.avg", process_set=mine,
                                                        prescale_factor=2.0)),
                (2 * sum(data(r, (2 * m + 1, 3), torch.float64, 33) for r in members) / m)[
                    sum([(2 * m + 1) // m + (1 if i < (2 * m + 1) % m else 0)
                         for i in range(pos)]):][:(2 * m + 1) // m + (1 if pos < (2 * m + 1) % m
                                                                       else 0)],
                "set reducescatter_async Average, prescale 2")

    # autograd (Horovod's: Sum's gradient is the gathered output gradients times the set's
    # size; alltoall's goes back along the splits).
    x = data(me, (2 * m, 3)).requires_grad_()
    hvd.reducescatter(x, op=hvd.Sum, process_set=mine).sum().backward()
    check.close(x.grad, torch.full((2 * m, 3), float(m)), "set reducescatter backward")
    x = data(me, (m, 2)).requires_grad_()
    w = torch.arange(2 * m, dtype=torch.float32).reshape(m, 2) + 10 * me
    (hvd.alltoall(x, process_set=mine) * w).sum().backward()
    check.close(x.grad, torch.stack([(torch.arange(2 * m, dtype=torch.float32).reshape(m, 2)
                                      + 10 * r)[pos] for r in members]),
                "set alltoall backward")

    # Unnamed operations are counted per set: the members' unnamed set ops do not put the
    # global ones out of step with the other set's.
    for _ in range(me % 2 + 1):
        hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=mine)
        hvd.barrier(process_set=mine)
    check.close(hvd.allreduce(torch.tensor([float(me)]), op=hvd.Sum),
                torch.tensor([float(sum(range(n)))]), "unnamed global op after unnamed set ops")

    # barrier, broadcast_object, allgather_object
    hvd.barrier(process_set=mine)
    got = hvd.broadcast_object({"from": members[-1]} if me == members[-1] else None,
                               root_rank=members[-1], process_set=mine)
    check(got == {"from": members[-1]}, "set broadcast_object %r" % (got,))
    got = hvd.allgather_object(("rank", me), process_set=mine)
    check(got == [("rank", r) for r in members], "set allgather_object %r" % (got,))

    # DistributedOptimizer within the set: the members' average gradient.
    torch.manual_seed(5)
    model = torch.nn.Linear(4, 2)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(), process_set=mine)
    xs = {r: data(r, (6, 4), salt=40) for r in members}
    model(xs[me]).pow(2).sum().backward()
    opt.step()
    ref = torch.nn.Linear(4, 2)
    ref.load_state_dict(start)
    grads = []
    for r in members:
        ref.zero_grad()
        ref(xs[r]).pow(2).sum().backward()
        grads.append([p.grad.clone() for p in ref.parameters()])
    with torch.no_grad():
        for i, p in enumerate(ref.parameters()):
            p -= 0.5 * sum(g[i] for g in grads) / len(members)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        check.close(p.detach(), q.detach(), "DistributedOptimizer in a set: %s" % name)
    # Every rank wraps its optimizer with the set {0}: on rank 0 (its one member) and, as
    # Horovod's, on the ranks outside it (the plain optimizer, no all-reduce), each steps with
    # its own gradient.
    first = hvd.add_process_set([0])
    model = torch.nn.Linear(4, 2)  # a fresh model: the last one's hooks would all-reduce still
    model.load_state_dict(ref.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(), process_set=first)
    model(xs[me]).pow(2).sum().backward()
    expect = [p.detach() - 0.5 * p.grad for p in model.parameters()]
    opt.step()
    for p, q in zip(model.parameters(), expect):
        check.close(p.detach(), q, "DistributedOptimizer of the set {0} on rank %d" % me)


def main():
    check = Checks("process_sets")
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    check(hvd.global_process_set.process_set_id == 0, "global set's id")
    check(hvd.global_process_set.size() == n and hvd.global_process_set.rank() == me
          and hvd.global_process_set.included(), "global set's size/rank/included")

    # Collective over every rank, in the same order everywhere.
    even = hvd.add_process_set([r for r in range(n) if r % 2 == 0])
    odd = hvd.add_process_set(hvd.ProcessSet([r for r in range(n) if r % 2]))
    check(isinstance(even, hvd.ProcessSet) and isinstance(odd, hvd.ProcessSet), "ProcessSets")
    check(even.process_set_id not in (None, 0)
          and odd.process_set_id not in (None, 0, even.process_set_id),
          "set ids (%r, %r)" % (even.process_set_id, odd.process_set_id))
    mine, other = (even, odd) if me % 2 == 0 else (odd, even)
    members = [r for r in range(n) if r % 2 == me % 2]
    check(mine.ranks == members and mine.size() == len(members), "ranks/size %r" % mine.ranks)
    check(mine.rank() == members.index(me) and mine.included(), "rank/included in own set")
    check(other.rank() == -1 and not other.included(), "rank/included in the other set")
    # The sets' ids agree on every rank.
    ids = hvd.allgather(torch.tensor([[even.process_set_id, odd.process_set_id]]))
    check(bool((ids == ids[0]).all()), "set ids agree across ranks: %s" % ids.tolist())

    for rnd in range(3):
        # allreduce: Sum, Average, Max, in every form.
        x = data(me, (5, 3), salt=rnd)
        refs = torch.stack([data(r, (5, 3), salt=rnd) for r in members])
        check.close(hvd.allreduce(x, op=hvd.Sum, name="x", process_set=mine), refs.sum(0),
                    "set allreduce Sum")
        check.close(hvd.allreduce(x, name="x.avg", process_set=mine), refs.mean(0),
                    "set allreduce Average")
        check.close(hvd.allreduce(x, op=hvd.Max, name="x.max", process_set=mine),
                    refs.max(0).values, "set allreduce Max")
        y = x.clone()
        hvd.allreduce_(y, op=hvd.Sum, name="x.inplace", process_set=mine)
        check.close(y, refs.sum(0), "set allreduce_")
        h = hvd.allreduce_async(x, op=hvd.Sum, name="x.async", process_set=mine)
        # A global all-reduce while the set's is in flight, under the same name.
        g = hvd.allreduce(x, op=hvd.Sum, name="x.async")
        check.close(hvd.synchronize(h), refs.sum(0), "set allreduce_async")
        check.close(g, sum(data(r, (5, 3), salt=rnd) for r in range(n)),
                    "global allreduce between set ops")
        y = x.clone()
        check.close(hvd.synchronize(hvd.allreduce_async_(y, op=hvd.Sum, name="x.async_",
                                                         process_set=mine)), refs.sum(0),
                    "set allreduce_async_")
        check.close(y, refs.sum(0), "set allreduce_async_ in place")
        i = data(me, (4,), torch.int64, salt=rnd)
        check.close(hvd.allreduce(i, op=hvd.Sum, name="i", process_set=mine),
                    sum(data(r, (4,), torch.int64, salt=rnd) for r in members), "int64 Sum")
        outs = hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum, name="grp", process_set=mine)
        check.close(outs[0], refs.sum(0), "grouped 0")
        check.close(outs[1], 2 * refs.sum(0), "grouped 1")

        # allgather: first dims differ by rank.
        a = data(me, (me + 1, 2), salt=10 + rnd)
        ref = torch.cat([data(r, (r + 1, 2), salt=10 + rnd) for r in members])
        check.close(hvd.allgather(a, name="a", process_set=mine), ref, "set allgather")
        check.close(hvd.synchronize(hvd.allgather_async(a, name="a.async", process_set=mine)),
                    ref, "set allgather_async")
        outs = hvd.grouped_allgather([a, a + 1], name="ga", process_set=mine)
        check.close(outs[0], ref, "grouped allgather 0")
        check.close(outs[1], ref + 1, "grouped allgather 1")

        # Global ops between the sets' ops.
        check.close(hvd.allgather(torch.tensor([me])), torch.arange(n), "global allgather")

        # broadcast from the set's last member (a rank of the job).
        root = members[-1]
        b = data(me, (3, 2), salt=20 + rnd)
        bref = data(root, (3, 2), salt=20 + rnd)
        check.close(hvd.broadcast(b, root, name="b", process_set=mine), bref, "set broadcast")
        c = b.clone()
        hvd.broadcast_(c, root, name="b_", process_set=mine)
        check.close(c, bref, "set broadcast_")
        check.close(hvd.synchronize(hvd.broadcast_async(b, root, name="b.async",
                                                        process_set=mine)), bref,
                    "set broadcast_async")
        c = b.clone()
        hvd.synchronize(hvd.broadcast_async_(c, root, name="b.async_", process_set=mine))
        check.close(c, bref, "set broadcast_async_")
        check.close(hvd.broadcast(b, 0, name="b"), data(0, (3, 2), salt=20 + rnd),
                    "global broadcast, same name")

    # autograd within the set
    x = data(me, (4,)).requires_grad_()
    hvd.allreduce(x, op=hvd.Sum, name="grad.ar", process_set=mine).sum().backward()
    check.close(x.grad, torch.full((4,), float(len(members))), "allreduce backward in set")
    x = data(me, (2, 3)).requires_grad_()
    w = torch.arange(6 * len(members), dtype=torch.float32).reshape(-1, 3)
    (hvd.allgather(x, name="grad.ag", process_set=mine) * w).sum().backward()
    pos = members.index(me)
    # The members' average gradient (every member's is w).
    check.close(x.grad, w[2 * pos:2 * pos + 2], "allgather backward in set")

    more_in_sets(check, n, me, mine, members)

    # refusals
    z = torch.ones(3)
    e = check.raises(hvd.PerseusError, lambda: hvd.allreduce(z, name="outsider",
                                                             process_set=other),
                     "outsider's allreduce", ["outsider", "not a member"])
    check(e is not None and e.code == -1, "outsider refused with INVALID_ARGUMENT")
    check.raises(hvd.PerseusError, lambda: hvd.allgather(z, name="outsider.ag",
                                                         process_set=other),
                 "outsider's allgather", ["not a member"])
    check.raises(hvd.PerseusError, lambda: hvd.broadcast_(z, other.ranks[0], name="outsider.b",
                                                          process_set=other),
                 "outsider's broadcast", ["not a member"])
    if n > 1:
        check.raises(hvd.PerseusError, lambda: hvd.broadcast(z, other.ranks[0], name="badroot",
                                                             process_set=mine),
                     "root outside the set", ["badroot", "not a member"])
    check.raises(ValueError, lambda: hvd.allreduce(z, process_set=hvd.ProcessSet([0])),
                 "a set not added", ["add_process_set"])
    check.raises(hvd.PerseusError, lambda: hvd.alltoall(z.reshape(-1, 1).repeat(len(other.ranks), 1),
                                                        process_set=other),
                 "outsider's alltoall", ["not a member"])
    check.raises(hvd.PerseusError, lambda: hvd.reducescatter(z, process_set=other),
                 "outsider's reducescatter", ["not a member"])
    check.raises(hvd.PerseusError, lambda: hvd.barrier(process_set=other),
                 "outsider's barrier", ["not a member"])
    if torch.cuda.is_available() and hvd.nccl_built():
        # Through host memory, with the result back on the tensor's device.
        got = hvd.allreduce(z.cuda(), op=hvd.Sum, process_set=mine)
        check(got.is_cuda and torch.equal(got.cpu(), z * len(members)), "CUDA tensor in a set")

    # A set of no ranks, as Horovod allows (its tests make the odd ranks' set on one rank):
    # nobody is a member; an operation on it is refused; it is removed like any set.
    empty = hvd.add_process_set([])
    check(empty.size() == 0 and empty.rank() == -1 and not empty.included(), "empty set")
    check.raises(hvd.PerseusError, lambda: hvd.allreduce(torch.ones(2), process_set=empty),
                 "an op on the empty set", ["not a member"])
    check(hvd.remove_process_set(empty) is True, "the empty set is removed")

    # A set of every rank, added after operations ran.
    everyone = hvd.add_process_set(list(range(n))[::-1])
    check(everyone.ranks == list(range(n)), "ranks sorted")
    check.close(hvd.allreduce(torch.tensor([float(me)]), op=hvd.Sum, name="x",
                              process_set=everyone), torch.tensor([float(sum(range(n)))]),
                "set of every rank")

    # Removal, as Horovod's: True, then the set cannot be used; the same ranks can be added
    # again; the global set and a removed set give False.
    check(hvd.remove_process_set(odd) is True, "remove_process_set(odd) is True")
    check.raises(ValueError, lambda: hvd.allreduce(torch.ones(2), process_set=odd),
                 "a removed set", ["not added"])
    check(hvd.remove_process_set(odd) is False, "removing it again is False")
    check(hvd.remove_process_set(hvd.global_process_set) is False, "the global set is kept")
    again = hvd.add_process_set([r for r in range(n) if r % 2])
    if me % 2:
        check.close(hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name="again",
                                  process_set=again), torch.tensor([float(n // 2)]),
                    "the removed set's ranks added again")
    else:
        check(not again.included(), "rank %d is not in the set added again" % me)
    hvd.barrier()
    hvd.shutdown()
    check.finish()


run(main)

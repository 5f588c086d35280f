"""perseus.mxnet in a process that no launcher started (run as `python alone.py`): a job of one
rank, as in Horovod. Every collective of every dtype and odd shapes gives its input back, the
Perseus KVStore pushes and pulls, and shutdown then init again works. Prints "mxnet alone: N
checks passed" on success."""
import threading

import numpy as np

import mxnet as mx

import perseus.mxnet as hvd

DTYPES = ("float32", "float64", "float16", "uint8", "int8", "int32", "int64")
SHAPES = ((1,), (7,), (3, 5), (13, 1, 3))
checks = 0


def check(ok, what):
    global checks
    assert ok, what
    checks += 1


def same(got, want, what):
    got = got.asnumpy() if isinstance(got, mx.nd.NDArray) else np.asarray(got)
    check(got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want),
          "%s: got %s %s %s, expected %s %s %s" % (what, got.dtype, got.shape, got.ravel()[:6],
                                                  want.dtype, want.shape, want.ravel()[:6]))


def data(shape, dtype, salt):
    rng = np.random.RandomState(salt)
    if dtype.startswith("float"):
        return (rng.rand(*shape) * 4 - 2).astype(dtype)
    return rng.randint(0 if dtype == "uint8" else -9, 10, size=shape).astype(dtype)


def every_op(round_):
    for i, dtype in enumerate(DTYPES):
        for j, shape in enumerate(SHAPES):
            want = data(shape, dtype, 10 * i + j + round_)
            x = mx.nd.array(want, dtype=dtype)
            tag = "%s %s" % (dtype, shape)
            for label, op in (("sum", hvd.Sum), ("min", hvd.Min), ("max", hvd.Max),
                              ("prod", hvd.Product)):
                same(hvd.allreduce(x, op=op, name="ar.%s.%s" % (tag, label)), want,
                     "allreduce %s %s" % (label, tag))
            if dtype.startswith("float"):
                same(hvd.allreduce(x, name="avg." + tag), want, "allreduce average " + tag)
            y = x.copy()
            hvd.allreduce_(y, op=hvd.Sum, name="ar_." + tag)
            same(y, want, "allreduce_ " + tag)
            outs = hvd.grouped_allreduce([x, x.copy()], op=hvd.Sum, name="gar." + tag)
            same(outs[1], want, "grouped_allreduce " + tag)
            same(hvd.allgather(x, name="ag." + tag), want, "allgather " + tag)
            same(hvd.broadcast(x, 0, name="bc." + tag), want, "broadcast " + tag)
            z = x.copy()
            hvd.broadcast_(z, 0, name="bc_." + tag)
            same(z, want, "broadcast_ " + tag)
            same(hvd.alltoall(x, name="a2a." + tag), want, "alltoall " + tag)
            out, received = hvd.alltoall(x, splits=[shape[0]], name="a2as." + tag)
            same(out, want, "alltoall with splits " + tag)
            same(received, np.array([shape[0]], dtype="int32"), "alltoall received_splits " + tag)
    x = mx.nd.array(data((11,), "float64", 3), dtype="float64")
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=6.0)
    check(np.allclose(got.asnumpy(), x.asnumpy() * 3.0), "allreduce prescale 0.5, postscale 6")
    hvd.barrier()


def kvstore():
    kv = hvd.create("dist_sync_perseus")
    check(kv.rank == 0 and kv.num_workers == 1, "the store's place: worker 0 of 1")
    kv.init("w", mx.nd.ones((5, 3)))
    kv.push("w", mx.nd.ones((5, 3)) * 4)
    out = mx.nd.zeros((5, 3))
    kv.pull("w", out=out)
    same(out, np.full((5, 3), 4, dtype="float32"), "kvstore push then pull, one worker")


def main():
    for round_ in range(2):
        hvd.init()
        check((hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
               hvd.cross_size()) == (0, 1, 0, 1, 0, 1), "a job of one rank, round %d" % round_)
        every_op(round_)
        if round_ == 0:
            kvstore()
        hvd.shutdown()
        check(not hvd.is_initialized(), "shut down, round %d" % round_)
        check(threading.active_count() == 1, "no thread left, round %d" % round_)
    print("mxnet alone: %d checks passed" % checks, flush=True)


main()

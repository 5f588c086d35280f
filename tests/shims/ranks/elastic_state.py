"""hvd.elastic's state objects and run() without a change of world (a plain perseusrun job), as
Horovod's elastic API defines them: commit saves, restore rolls back to the last commit, sync
takes rank 0's values, the ElasticSampler splits what an epoch has not processed among the ranks,
HorovodInternalError is what a broken world raises, and run() syncs before calling the function.
Prints "elastic_state: N checks passed"."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import perseus.torch as hvd  # noqa: E402
from common import Checks, run  # noqa: E402


def main():
    hvd.init()
    check = Checks("elastic_state")
    n, me = hvd.size(), hvd.rank()
    elastic = hvd.elastic

    # ObjectState: attributes, commit (a copy, not a reference), restore, sync from rank 0.
    state = elastic.ObjectState(epoch=me, seen=[me])
    check(state.epoch == me and state.seen == [me], "ObjectState attributes")
    state.epoch = 10 + me
    state.seen.append(99)
    state.restore()
    check(state.epoch == me and state.seen == [me], "restore undoes what was not committed "
          "(got %r %r)" % (state.epoch, state.seen))
    state.epoch = 20 + me
    state.commit()
    state.epoch = 30
    state.restore()
    check(state.epoch == 20 + me, "restore goes back to the last commit")
    state.sync()
    check(state.epoch == 20 and state.seen == [0], "sync takes rank 0's committed values "
          "(got %r %r)" % (state.epoch, state.seen))

    # Reset callbacks run on on_reset, in order.
    calls = []
    state.register_reset_callbacks([lambda: calls.append(1), lambda: calls.append(2)])
    state.on_reset()
    check(calls == [1, 2], "reset callbacks run in order")
    # No host change in a plain job: check_host_updates raises nothing.
    try:
        state.check_host_updates()
        check(True, "")
    except elastic.HostsUpdatedInterrupt:
        check(False, "check_host_updates raised in a job whose hosts never change")

    # TorchState: the model and the optimizer through their state_dict, other values as objects.
    torch.manual_seed(me)  # different parameters on every rank
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ts = elastic.TorchState(model=model, optimizer=optimizer, batch=5 + me)
    saved = [p.detach().clone() for p in model.parameters()]
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()
    ts.batch = 7
    ts.restore()
    check(all(torch.equal(p, s) for p, s in zip(model.parameters(), saved)),
          "TorchState.restore puts the committed parameters back")
    check(ts.batch == 5 + me, "TorchState.restore puts the plain values back")
    check(len(optimizer.state_dict()["state"]) == 0, "TorchState.restore: the optimizer too")
    ts.sync()
    gathered = hvd.allgather(torch.cat([p.detach().flatten() for p in model.parameters()])
                             .unsqueeze(0), name="elastic.params")
    check(all(torch.equal(gathered[0], gathered[r]) for r in range(n)),
          "TorchState.sync gives every rank rank 0's parameters")
    check(ts.batch == 5, "TorchState.sync gives every rank rank 0's values")
    ts.model = model  # a handler's value set again is saved at once (Horovod's set_value)
    check(ts.model is model, "TorchState attribute of a handler")

    # ElasticSampler: every sample once per epoch over the ranks; after record_batch and a
    # reset (a new world), only what is left is split.
    data = list(range(23))
    sampler = elastic.ElasticSampler(data, shuffle=True, seed=3)
    mine = list(sampler)
    everyone = hvd.allgather_object(mine, name="elastic.sampler")
    flat = sorted(i for part in everyone for i in part)
    check(set(flat) == set(data) and len(flat) == len(sampler) * n,
          "ElasticSampler covers the dataset, padded to equal parts")
    sampler.record_batch(0, 2)
    check(sampler.processed_num == 2 * n, "record_batch counts every rank's batch")
    sampler.reset()
    rest = hvd.allgather_object(list(sampler), name="elastic.sampler.rest")
    left = {i for part in rest for i in part}
    check(len(left) == 23 - 2 * n, "after record_batch only the unprocessed samples are split "
          "(%d left)" % len(left))
    state_dict = sampler.state_dict()
    sampler.set_epoch(1)
    check(sampler.processed_num == 0 and sampler.epoch == 1, "set_epoch starts an epoch afresh")
    sampler.load_state_dict(state_dict)
    check(sampler.processed_num == 2 * n and sampler.epoch == 0, "load_state_dict")

    # run(): syncs, then calls the function once in a job whose world never changes.
    ran = []
    counter = elastic.ObjectState(value=100 + me)

    @elastic.run
    def train(s, extra):
        ran.append((s.value, extra))
        return "done"

    check(train(counter, "x") == "done" and ran == [(100, "x")],
          "run syncs from rank 0 and returns the function's result (%r)" % ran)
    check(issubclass(hvd.HorovodInternalError, hvd.PerseusError) and
          issubclass(hvd.HorovodInternalError, RuntimeError),
          "HorovodInternalError is a PerseusError and a RuntimeError")
    check(elastic.HorovodInternalError is hvd.HorovodInternalError, "one HorovodInternalError")
    hvd.shutdown()
    check.finish()


run(main)

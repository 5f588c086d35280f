"""Horovod's elastic API for perseus.mxnet (`hvd.elastic`): `run`, `State`, `ObjectState`,
`HostsUpdatedInterrupt`, and `MXNetState` for Gluon parameters and trainers.

Horovod itself has no elastic API for MXNet (it has TensorFlow's, Keras's and PyTorch's); this
is the same model as perseus.torch.elastic (perseus/_elastic.py, docs/USAGE.md "Elastic jobs")
with MXNet's state: a Gluon ParameterDict (or a dict of name -> Parameter) and a gluon.Trainer
(hvd.DistributedTrainer), saved in host memory at each commit and broadcast from rank 0 at each
sync. DistributedTrainer divides the gradients by the world's size as it is at each step, so the
average stays right when the world changes.
"""
import copy

from perseus import _elastic
from perseus._elastic import HostsUpdatedInterrupt, State  # noqa: F401 - Horovod's names
from perseus._native import HorovodInternalError  # noqa: F401
from perseus.mxnet import ops
from perseus.mxnet.functions import broadcast_parameters


run, ObjectState, _broadcast_object = _elastic.for_shim(ops)


def _parameters(params):
    """{name: Parameter} of a ParameterDict or a dict, in sorted-name order."""
    return {name: params[name] for name in sorted(params.keys(), key=str)}


class MXNetState(ObjectState):
    """The state of an MXNet Gluon training process: `params` (block.collect_params()) through
    copies of their data, `trainer` (a gluon.Trainer or hvd.DistributedTrainer) through its
    optimizer's states and update counts, and any other keyword argument as an ObjectState
    attribute."""

    def __init__(self, params=None, trainer=None, **kwargs):
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "trainer", trainer)
        self._save_mxnet()
        super().__init__(**kwargs)

    def _save_mxnet(self):
        saved = {}
        if self.params is not None:
            saved["params"] = {name: p.data().copy()
                               for name, p in _parameters(self.params).items()}
        if self.trainer is not None:
            saved["trainer"] = self._trainer_state()
        object.__setattr__(self, "_saved_mxnet", saved)

    def _trainer_state(self):
        trainer = self.trainer
        optimizer = trainer._optimizer
        return {"states": [u.get_states(dump_optimizer=False) for u in trainer._updaters],
                "num_update": optimizer.num_update,
                "index_update_count": copy.deepcopy(optimizer._index_update_count)}

    def _load_trainer_state(self, state):
        trainer = self.trainer
        for updater in trainer._updaters:
            updater.set_states(state["states"][0])
        trainer._optimizer.num_update = state["num_update"]
        trainer._optimizer._index_update_count = copy.deepcopy(state["index_update_count"])

    def save(self):
        self._save_mxnet()
        super().save()

    def restore(self):
        if "params" in self._saved_mxnet:
            parameters = _parameters(self.params)
            for name, data in self._saved_mxnet["params"].items():
                parameters[name].set_data(data)
        if "trainer" in self._saved_mxnet:
            self._load_trainer_state(self._saved_mxnet["trainer"])
        super().restore()

    def sync(self):
        if self.params is not None:
            broadcast_parameters(self.params, root_rank=0)
        if self.trainer is not None:
            self._load_trainer_state(_broadcast_object(self._trainer_state()))
        super().sync()


__all__ = ["run", "State", "ObjectState", "MXNetState", "HostsUpdatedInterrupt",
           "HorovodInternalError"]

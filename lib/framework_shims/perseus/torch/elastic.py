"""Horovod's elastic API (`hvd.elastic`): not built yet in perseus.torch.

Horovod's elastic scripts keep their processes when a host is lost: the state rolls back to its
last commit and the survivors join a new world in the same process. Perseus does not do that yet
(issue 20); what it does is restart every rank (perseusrun --max-restarts, and elastic mode with
--host-discovery-script), so a script resumes from its own checkpoint, as under torchrun. Every
name here raises NotImplementedError saying so, rather than an AttributeError or a job that
trains without the elasticity it asked for.
"""

_WHY = ("perseus.torch: hvd.elastic (Horovod's in-process elastic API: %s) is not implemented "
        "yet. Run the script without it under perseusrun --max-restarts N, or in elastic mode "
        "with --host-discovery-script, saving a checkpoint each epoch and loading it at start: "
        "every rank is restarted after a failure or a change of hosts (docs/USAGE.md, "
        "'Elastic jobs').")


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod raises it when hosts were added or removed; Perseus never does (see above)."""


def _refuse(what):
    raise NotImplementedError(_WHY % what)


def run(func):
    _refuse("elastic.run")


class State:
    def __init__(self, *args, **kwargs):
        _refuse(type(self).__name__)


class ObjectState(State):
    pass


class TorchState(ObjectState):
    pass


__all__ = ["run", "State", "ObjectState", "TorchState", "HostsUpdatedInterrupt"]

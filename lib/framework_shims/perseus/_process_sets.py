"""Horovod's process sets over libperseus's, shared by perseus.torch and perseus.mxnet:
ProcessSet, global_process_set, add_process_set, remove_process_set. Framework-neutral."""
from perseus import _native


class ProcessSet:
    """A group of ranks whose operations run among themselves only (libperseus's process sets,
    which move host memory: GPU tensors outside the global set go through a CPU copy). Make
    one with add_process_set(ranks), collectively over every rank; pass it as process_set= to
    any operation (allreduce, allgather, broadcast, alltoall, reducescatter, their async,
    in-place and grouped forms, barrier, broadcast_object, allgather_object) and to
    DistributedOptimizer. global_process_set is every rank. Ranks are the job's ranks
    (broadcast's root_rank too)."""

    def __init__(self, ranks=None):
        self.ranks = None if ranks is None else sorted(int(r) for r in ranks)
        self.process_set_id = None

    def size(self):
        return _native.size() if self.ranks is None else len(self.ranks)

    def rank(self):
        """This process's index in the set (-1 when it is not a member)."""
        if self.ranks is None:
            return _native.rank()
        me = _native.rank()
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self):
        return self.ranks is None or _native.rank() in self.ranks

    def __repr__(self):
        if self.process_set_id == 0:
            return "ProcessSet(global)"
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)


SET_SIZES = {}  # libperseus set number -> its number of ranks
global_process_set = ProcessSet()
global_process_set.process_set_id = _native.GLOBAL_PROCESS_SET


def set_id(process_set):
    """The libperseus set number of process_set (None: the global set)."""
    if process_set is None or process_set is global_process_set:
        return _native.GLOBAL_PROCESS_SET
    if not isinstance(process_set, ProcessSet):
        raise TypeError("process_set must be a ProcessSet (from add_process_set), not %r"
                        % (process_set,))
    if process_set.process_set_id is None:
        raise ValueError("%r was not added: call hvd.add_process_set(...) on every rank first"
                         % (process_set,))
    return process_set.process_set_id


def of(process_set):
    """process_set, or the global set for None."""
    return global_process_set if process_set is None else process_set


def members(set_number):
    """How many ranks the set numbered set_number has (every rank for the global set)."""
    if set_number == _native.GLOBAL_PROCESS_SET:
        return _native.size()
    return SET_SIZES[set_number]


def add_process_set(process_set):
    """Makes a process set of the given ranks (a list, or a ProcessSet not yet added) and
    returns it as a ProcessSet. Collective over EVERY rank: every rank calls it, members or not,
    with the same ranks and in the same order."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None or process_set is global_process_set:
        raise ValueError("add_process_set needs the ranks of the set")
    if process_set.process_set_id is not None:
        raise ValueError("%r was already added" % (process_set,))
    if not process_set.ranks:
        # As Horovod: a set of no ranks may be made (every rank calls this alike, so every rank
        # numbers it alike, below 0: libperseus makes no set, and no rank is a member of it).
        global _EMPTY_SETS
        _EMPTY_SETS -= 1
        process_set.process_set_id = _EMPTY_SETS
        SET_SIZES[process_set.process_set_id] = 0
        return process_set
    process_set.process_set_id = _native.add_process_set(process_set.ranks)
    SET_SIZES[process_set.process_set_id] = len(process_set.ranks)
    return process_set


_EMPTY_SETS = 0  # the last number given to a set of no ranks (-1, -2, ...)


def remove_process_set(process_set):
    """Removes a process set made by add_process_set, as Horovod does: collective over EVERY
    rank (a barrier of the job), after which the ProcessSet can no longer be used (it may be
    added again). Returns True, or False for the global set or a set that is not added.
    libperseus keeps the set's number until perseus_finalize; nothing else holds on to it."""
    if not isinstance(process_set, ProcessSet) or process_set is global_process_set or \
            process_set.process_set_id in (None, _native.GLOBAL_PROCESS_SET):
        return False
    _native.barrier()
    SET_SIZES.pop(process_set.process_set_id, None)
    process_set.process_set_id = None
    return True



"""Horovod's MXNet functions over perseus.mxnet's collectives: broadcast_parameters."""
import types

import mxnet as mx

from perseus.mxnet import ops


def _is_parameter(value):
    return isinstance(value, mx.gluon.Parameter)


def _append_broadcast_init(param, root_rank, name):
    """param._init_impl that broadcasts root_rank's value once the deferred init has run."""
    init_impl = param._init_impl

    def wrapped_init_impl(self, *args, **kwargs):
        init_impl(*args, **kwargs)
        data = self.list_data()
        ops.grouped_broadcast_(data, root_rank,
                               ["broadcast_parameters.%s.%d" % (name, i)
                                for i in range(len(data))])
    return wrapped_init_impl


def broadcast_parameters(params, root_rank=0, prefix=None):
    """Every rank's parameters become root_rank's. params: a Gluon ParameterDict
    (block.collect_params()), a dict of name -> gluon.Parameter (MXNet 2's collect_params) or a
    dict of name -> NDArray (Module.get_params()'s arg_params/aux_params). Parameters whose
    initialisation is deferred are broadcast right after it happens (on every rank: the first
    forward pass, which every rank makes). Keys are visited in sorted order, so every rank must
    hold the same keys."""
    if ops.size() == 1:
        return
    prefix = "" if prefix is None else prefix
    if isinstance(params, mx.gluon.ParameterDict):
        items = sorted(params.items())
    elif isinstance(params, dict):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    else:
        raise ValueError("broadcast_parameters: invalid params of type %s (a ParameterDict or a "
                         "dict of Parameters or NDArrays)" % type(params).__name__)
    tensors, names = [], []
    for name, value in items:
        full = "broadcast_parameters.%s%s" % (prefix, name)
        if _is_parameter(value):
            try:
                data = value.list_data()
            except mx.gluon.parameter.DeferredInitializationError:
                value._init_impl = types.MethodType(
                    _append_broadcast_init(value, root_rank, prefix + str(name)), value)
                continue
            for i, d in enumerate(data):
                tensors.append(d)
                names.append("%s.%d" % (full, i))
        elif isinstance(value, mx.nd.NDArray):
            tensors.append(value)
            names.append(full)
        else:
            raise ValueError("broadcast_parameters: %r is a %s, not a Parameter or an NDArray"
                             % (name, type(value).__name__))
    ops.grouped_broadcast_(tensors, root_rank, names)

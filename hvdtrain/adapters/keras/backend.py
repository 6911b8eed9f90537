"""Which Horovod the Keras adapter runs on: the one that matches Keras's backend
(``horovod.tensorflow`` or ``horovod.torch``), and its workers as a
:class:`hvdtrain.collective.Collective` and a
:class:`hvdtrain.collective.TensorCollective`.

Only one of the two Horovod modules is ever imported in a process: both carry a copy
of Horovod's core, and initialising both crashes under MPI.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import keras

from hvdtrain import watchdog
from hvdtrain.collective import Collective, HorovodCollective, ReduceOp, TensorCollective

SUPPORTED_BACKENDS = {"tensorflow": "horovod.tensorflow", "torch": "horovod.torch"}
# Horovod pairs collectives across ranks by name. In TensorFlow graphs the name gets the
# current name scope, which holds per-process counters ("sgd_3/"): leave it out.
UNSCOPED = {"ignore_name_scope": True} if keras.backend.backend() == "tensorflow" else {}


@functools.cache
def horovod() -> ModuleType:
    """``horovod.tensorflow`` or ``horovod.torch``, whichever matches Keras's backend."""
    backend = keras.backend.backend()
    if backend not in SUPPORTED_BACKENDS:
        raise RuntimeError(
            f"hvdtrain's Keras adapter supports the Keras backends "
            f"{' and '.join(SUPPORTED_BACKENDS)}, not {backend!r}; set KERAS_BACKEND=tensorflow "
            "(or torch) before importing keras"
        )
    return importlib.import_module(SUPPORTED_BACKENDS[backend])


@functools.cache
def collective() -> Collective:
    """The workers of the Horovod that matches Keras's backend."""
    return HorovodCollective(horovod(), "init()")


@dataclass(frozen=True)
class KerasTensors:
    """The workers of the Horovod that matches Keras's backend (all of them, or one
    process set's) as the core's :class:`~hvdtrain.collective.TensorCollective`, on
    Keras tensors and in TensorFlow graphs: each operation's result is its own handle."""

    process_set: Any = None

    def _options(self) -> dict[str, Any]:
        within = {} if self.process_set is None else {"process_set": self.process_set}
        return {**within, **UNSCOPED}

    def size(self) -> int:
        return int((self.process_set or horovod().global_process_set).size())

    def allreduce(self, tensor: Any, name: str, *, op: ReduceOp = "sum",
                  prescale: float = 1.0, postscale: float = 1.0) -> Any:
        return horovod().allreduce(tensor, op=_horovod_op(op), prescale_factor=prescale,
                                   postscale_factor=postscale, name=name, **self._options())

    def reduce_scatter(self, rows: Any, name: str, *, op: ReduceOp = "sum",
                       prescale: float = 1.0, postscale: float = 1.0) -> Any:
        return horovod().reducescatter(rows, op=_horovod_op(op), prescale_factor=prescale,
                                       postscale_factor=postscale, name=name,
                                       **self._options())

    def allgather(self, tensor: Any, name: str) -> Any:
        return horovod().allgather(tensor, name=name, **self._options())

    def broadcast(self, tensor: Any, root_rank: int, name: str) -> Any:
        return horovod().broadcast(tensor, root_rank, name=name, **self._options())

    def wait(self, handle: Any) -> Any:
        return handle


def _horovod_op(op: ReduceOp) -> Any:
    hvd = horovod()
    return {"sum": hvd.Sum, "average": hvd.Average, "min": hvd.Min, "max": hvd.Max}[op]


def tensors(process_set: Any = None) -> TensorCollective:
    """The workers of the Horovod that matches Keras's backend (all of them, or
    ``process_set``'s) moving tensors; each adapter has its ``tensors()``."""
    return KerasTensors(process_set)


def sum_numbers(numbers: list[float], name: str) -> list[float]:
    """Each number summed over every rank (one float64 allreduce, eagerly): the
    exchange of :mod:`hvdtrain.step_timing`."""
    import numpy as np

    with watchdog.guard("the step-time exchange"):
        summed = tensors().allreduce(
            keras.ops.convert_to_tensor(np.array(numbers, np.float64)), name)
    return [float(n) for n in keras.ops.convert_to_numpy(summed)]


def in_tensorflow_graph() -> bool:
    """Whether this runs on the TensorFlow backend inside a graph (a ``tf.function``, as
    ``fit``'s step), where a failure can only fail the graph and Python runs only while
    the graph is traced."""
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    return not tf.executing_eagerly()


def accelerator_visible() -> bool:
    """Whether Keras's backend sees a GPU."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return bool(tf.config.list_physical_devices("GPU"))
    import torch

    return torch.cuda.is_available()


def bitcast16(tensor: Any, dtype: str) -> Any:
    """Reinterpret 16-bit values (bfloat16 <-> int16) without changing their bits."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.bitcast(tensor, getattr(tf, dtype))
    import torch

    return tensor.view(getattr(torch, dtype))

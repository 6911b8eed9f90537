"""Which Horovod the Keras adapter runs on: the one that matches Keras's backend
(``horovod.tensorflow`` or ``horovod.torch``), and its workers as a
:class:`hvdtrain.collective.Collective`.

Only one of the two Horovod modules is ever imported in a process: both carry a copy
of Horovod's core, and initialising both crashes under MPI.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

import keras

from hvdtrain.collective import Collective, HorovodCollective

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


def accelerator_visible() -> bool:
    """Whether Keras's backend sees a GPU."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return bool(tf.config.list_physical_devices("GPU"))
    import torch

    return torch.cuda.is_available()

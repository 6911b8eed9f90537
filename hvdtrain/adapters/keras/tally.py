"""The flat gradient buffer of the Keras adapter on TensorFlow, with its tally.

The Keras counterpart of :mod:`hvdtrain.adapters.torch.tally`: float32 (or float64)
gradients are copied into one buffer (``hvdtrain._tf_packing``'s
``HvdtrainPackWithTally``), and the tally of :mod:`hvdtrain.tally` follows them:
the rank's 1, which the reduction turns into the number of ranks that sent gradients,
and the L2 norm of its gradients, taken in the same pass as the copy. Reduced, the norms
bound every element of the reduced gradients, so the non-finite check reads one number
instead of every gradient; only when that bound is not below
:func:`hvdtrain.tally.finite_bound_limit` does ``HvdtrainUnpackChecked`` read the
gradients to decide.

The ops are built by ``setup.py`` when TensorFlow and a C++ compiler are there
(``scripts/setup.sh`` insists); without them, on a GPU, and for other dtypes,
compressions or backends,
:func:`hvdtrain.adapters.keras.reduction.average_gradients` falls back to Horovod's
grouped allreduce and a separate check.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import keras
import numpy as np

from hvdtrain.collective import ReduceOp, TensorCollective
from hvdtrain.tally import finite_bound_limit

PACKED_DTYPES = ({"float32"}, {"float64"})


@functools.cache
def native_ops() -> ModuleType | None:
    """The loaded ``hvdtrain._tf_packing`` ops, or None: not built, not on TensorFlow, or
    a GPU is visible (the ops run on the CPU only, and gradients on a GPU would be copied
    to it and reduced there instead of by NCCL)."""
    if keras.backend.backend() != "tensorflow":
        return None
    spec = importlib.util.find_spec("hvdtrain._tf_packing")
    if spec is None or spec.origin is None:
        return None
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return None
    return tf.load_op_library(spec.origin)


def packs(tensors: Sequence[Any]) -> bool:
    """Whether ``tensors`` can travel in the flat buffer: the ops are built, and the
    tensors are all float32 or all float64, with fully known shapes."""
    if native_ops() is None:
        return False
    import tensorflow as tf

    return ({tf.as_dtype(t.dtype).name for t in tensors} in PACKED_DTYPES
            and all(tf.TensorShape(t.shape).is_fully_defined() for t in tensors))


def pack(tensors: Sequence[Any], *, bound: bool) -> Any:
    """``tensors`` in one buffer of their dtype, then the tally: 1 and their L2 norm (with
    ``bound``) or infinity (without).

    Args:
        tensors: float32 or float64 tensors of fully known shapes (:func:`packs`).
        bound: whether to take the norm (the non-finite check needs it).

    Returns:
        A 1-D tensor: each tensor flattened from a multiple of 16 elements, zeros
        between them, then the ``TALLY`` numbers.
    """
    return native_ops().hvdtrain_pack_with_tally(list(tensors), bound=bound)


def unpack(flat: Any, shapes: Sequence[Any], step: Any, *, check: bool,
           message: str | Sequence[str], limit: float | None = None) -> tuple[list[Any], Any]:
    """The tensors and the tally of a (reduced) :func:`pack` buffer.

    Args:
        flat: the buffer.
        shapes: the tensors' shapes, as packed.
        step: the optimizer step (an int64 tensor), put into the message.
        check: unless the reduced bound is below ``limit``, read the tensors, and fail
            with the message of the first that holds NaN or Inf (``{step}`` replaced).
        message: the error's text, or one text per tensor (naming it).
        limit: :func:`hvdtrain.tally.finite_bound_limit` of the reduction; None:
            that of a sum without scaling (half the dtype's largest number).

    Returns:
        (views of the tensors in ``flat``, the ``TALLY`` numbers).
    """
    import tensorflow as tf

    messages = [message] * len(shapes) if isinstance(message, str) else list(message)
    if limit is None:
        limit = finite_bound_limit(float(np.finfo(flat.dtype.as_numpy_dtype).max),
                                   prescale=1.0, unit=1.0)
    tensors, tally = native_ops().hvdtrain_unpack_checked(
        flat, tf.cast(step, tf.int64), tf.constant(limit, dtype=flat.dtype), N=len(shapes),
        shapes=[tf.TensorShape(s) for s in shapes], check=check, messages=messages)
    return list(tensors), tally


def allreduce(tensors: Sequence[Any], workers: TensorCollective, *, op: ReduceOp,
              prescale: float, postscale: float, step: Any, check: bool,
              messages: Sequence[str], limit: float) -> tuple[list[Any], Any]:
    """``tensors`` reduced over ``workers`` through one flat buffer with its tally:
    :func:`pack`, one allreduce (``op``, Horovod's ``prescale`` and ``postscale``),
    :func:`unpack` (with its check against ``limit``). Returns (the reduced tensors, the
    reduced ``TALLY`` numbers)."""
    flat = pack(tensors, bound=check)
    flat = workers.wait(workers.allreduce(flat, "hvdtrain.gradients", op=op,
                                          prescale=prescale, postscale=postscale))
    return unpack(flat, [t.shape for t in tensors], step, check=check, message=messages,
                  limit=limit)


def require_finite_natively(tensors: Sequence[Any], step: Any, messages: Sequence[str]
                            ) -> list[Any]:
    """``tensors`` unchanged (the same buffers), after failing with the message of the
    first that holds NaN or Inf (``HvdtrainRequireFinite``: float16, bfloat16, float32
    or float64 tensors, mixed; ``{step}`` in the message replaced by ``step``). The ops
    must be loaded (:func:`native_ops`)."""
    import tensorflow as tf

    return list(native_ops().hvdtrain_require_finite(list(tensors), tf.cast(step, tf.int64),
                                                     messages=list(messages)))

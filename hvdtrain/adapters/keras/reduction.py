"""Gradient reduction on Keras 3 tensors, with its checks: :class:`Reduction` (how an
update's gradients are combined, the distributed optimizers' one setting) and its work,
:func:`average_gradients`, the average (or sum) of every worker's gradients in one
collective (a flat buffer with its tally on
TensorFlow's CPU, a grouped allreduce, or, on a Horovod without hvdtrain's bfloat16
patch, a bfloat16 allgather), the count of the workers that contributed (for ``join``),
and the checks that the result is finite.

Written with ``keras.ops``, so it serves Keras on the TensorFlow backend (in graph or
eager mode) and on the torch backend alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

from hvdtrain.adapters.keras import backend, step_events, tally
from hvdtrain.adapters.keras.backend import UNSCOPED, horovod
from hvdtrain.collective import TensorCollective, any_rank
from hvdtrain.compression import require_bfloat16_reduction, wire_format
from hvdtrain.nonfinite import SKIP_REMEDY, NonFiniteGradientError, nonfinite_gradient_message
from hvdtrain.step_events import StepObservers, observers_of
from hvdtrain.tally import COUNT, finite_bound_limit, joined_rescale, some_ranks_joined
from hvdtrain.validation import require_compression, require_positive_number

# Where the non-finite error shows the optimizer step (a tensor known only at run time);
# hvdtrain._tf_packing's unpack op replaces this very text.
_STEP_PLACEHOLDER = "{step}"


def check_op(op: Any) -> None:
    """Raise ValueError unless ``op`` is Horovod's Average or Sum."""
    hvd = horovod()
    if op not in (hvd.Average, hvd.Sum):
        raise ValueError("op must be Average or Sum (Adasum is not supported for Keras)")


@dataclasses.dataclass(frozen=True)
class Reduction:
    """How an update's gradients are combined across workers (a cache key, so frozen):
    the distributed optimizers' and the gradient tape's one setting, and the way to
    apply it (:meth:`observed`, :meth:`apply`)."""

    compression: str | None
    op: Any
    prescale: float = 1.0
    postscale: float = 1.0
    process_set: Any = None

    def observers(self) -> StepObservers:
        """Whom its steps are told to (:func:`hvdtrain.step_events.observers_of`)."""
        job = backend.horovod().size()
        return observers_of(job if self.process_set is None else self.process_set.size(), job)

    def observed(self, grads: Sequence[Any], step: Any, *, check_step: Any = None,
                 remedy: str = SKIP_REMEDY, names: Sequence[str] | None = None,
                 local: Sequence[bool] | None = None, last: bool = False
                 ) -> tuple[list[Any], step_events.ObservedReduction]:
        """:meth:`apply`, told to the step events: the reduction of ``step`` starts
        after ``grads`` and finishes with the result (``last``: no step follows, as
        for a gradient tape). Returns the reduced gradients and what the update tells
        when it is over (:func:`.step_events.step_finished`)."""
        told = step_events.reduction_started(step, after=grads, observers=self.observers())
        reduced = self.apply(grads, check_step, remedy, names, local)
        step_events.reduction_finished(told, after=reduced, last=last)
        return reduced, told

    def apply(self, grads: Sequence[Any], check_step: Any = None,
              remedy: str = SKIP_REMEDY, names: Sequence[str] | None = None,
              local: Sequence[bool] | None = None) -> list[Any]:
        """``grads`` reduced (:func:`average_gradients`, which also takes ``check_step``,
        ``remedy`` and ``names``). ``local``: which gradients are of worker-local
        variables (Horovod's ``register_local_var``): those are not reduced but divided
        by the number of workers (Horovod's ``scale_local_gradients``)."""
        if local is None or not any(local):
            return average_gradients(
                grads, self.compression, self.op, prescale=self.prescale,
                postscale=self.postscale, process_set=self.process_set,
                check_step=check_step, remedy=remedy, names=names)
        shared = self.apply([None if mine else g for g, mine in zip(grads, local, strict=True)])
        size = backend.horovod().size()
        reduced = [g / size if mine and g is not None else averaged
                   for g, averaged, mine in zip(grads, shared, local, strict=True)]
        return reduced if check_step is None else require_finite(reduced, check_step,
                                                                 remedy, names)


def checked_reduction(compression: Any, op: Any, predivide: float, process_set: Any,
                      summed_passes: int) -> Reduction:
    """The checked reduction for :func:`DistributedOptimizer`'s arguments."""
    hvd = backend.horovod()
    if compression is hvd.Compression.none:
        compression = None
    elif compression is hvd.Compression.fp16:
        compression = "fp16"
    op = hvd.Average if op is None else op
    require_compression(compression)
    check_op(op)
    require_positive_number("gradient_predivide_factor", predivide)
    if predivide != 1.0 and op != hvd.Average:
        raise ValueError("gradient_predivide_factor needs op=Average (it splits the "
                         "average's division into a part before and one after the sum)")
    return Reduction(compression, op, 1.0 / predivide, predivide * summed_passes, process_set)


def average_gradients(grads: Sequence[Any], compression: str | None, op: Any, *,
                      prescale: float = 1.0, postscale: float = 1.0,
                      process_set: Any = None, check_step: Any = None,
                      remedy: str = SKIP_REMEDY, names: Sequence[str] | None = None
                      ) -> list[Any]:
    """Reduce every non-None gradient across workers in one collective.

    Without compression, float32 or float64 gradients (all of one dtype) on
    TensorFlow's CPU travel in one flat buffer (:mod:`hvdtrain.adapters.keras.tally`,
    when its ops are built); other gradients, and "fp16", use one Horovod grouped
    allreduce; "bf16" too, its gradients cast to bfloat16 (:class:`BFloat16Codec`), on a
    Horovod with hvdtrain's patch 0011-bfloat16. Without it (Horovod 0.28.1 has no
    bfloat16 reduction), "bf16" concatenates the gradients into one buffer, sends it as
    bfloat16 through one allgather and adds the ranks' values in rank order.
    ``prescale`` multiplies each rank's gradients before the reduction and ``postscale``
    the result (Horovod's factors); ``process_set`` limits the reduction to its ranks
    (None: every rank).

    An average (except through the allgather) sends a 1 with the gradients, which
    counts the ranks that sent gradients: a rank that has called Horovod's ``join()``
    sends zeros, and the average is then taken over the others only, as one process on
    their batches would.

    Args:
        check_step: when given (the optimizer step), stop training, as
            :func:`require_finite` does, if a reduced gradient holds NaN or Inf; in the
            flat buffer this reads one bound instead of every gradient.
        remedy: the advice that ends that error's message.
        names: the name of each gradient's variable, for that message.
    """
    present = [i for i, g in enumerate(grads) if g is not None]
    named = None if names is None else [names[i] for i in present]
    if not present:
        return list(grads)
    tensors = [dense(grads[i]) for i in present]
    within = {} if process_set is None else {"process_set": process_set}
    hvd = horovod()
    workers = backend.tensors(process_set)
    ranks = workers.size()
    average = op == hvd.Average
    # What one rank's 1 (and each gradient element) becomes in the reduction.
    unit = prescale * postscale / (ranks if average else 1)
    if compression == "bf16" and not wire_format("bf16").reduced_natively:
        if prescale != 1.0:
            tensors = [t * prescale for t in tensors]
        reduced = _bf16_reduce(tensors, average, workers)
        if postscale != 1.0:
            reduced = [t * postscale for t in reduced]
    elif compression is None and tally.packs(tensors):
        return _placed(grads, present, _flat_reduce(
            tensors, average, prescale, postscale, unit, workers, check_step, remedy, named))
    else:
        if any(keras.backend.standardize_dtype(t.dtype) == "bfloat16" for t in tensors):
            require_bfloat16_reduction("Averaging bfloat16 gradients (of bfloat16 variables)")
        if average:  # a 1 from each rank that sent gradients
            tensors.append(ops.ones((), dtype=tensors[0].dtype))
        codec = {"fp16": hvd.Compression.fp16, "bf16": BFloat16Codec}.get(
            compression, hvd.Compression.none)
        reduced = hvd.grouped_allreduce(tensors, op=op, compression=codec,
                                        prescale_factor=prescale, postscale_factor=postscale,
                                        name="hvdtrain.gradients", **within, **UNSCOPED)
        if average:
            reduced = _over_contributors(reduced[:-1], reduced[-1], unit, ranks)
    if check_step is not None:
        reduced = require_finite(reduced, check_step, remedy, named)
    return _placed(grads, present, reduced)


def _placed(grads: Sequence[Any], present: list[int], reduced: list[Any]) -> list[Any]:
    """``grads`` with the gradient at each index in ``present`` replaced, in order."""
    result = list(grads)
    for i, tensor in zip(present, reduced, strict=True):
        result[i] = tensor
    return result


def _flat_reduce(tensors: list[Any], average: bool, prescale: float, postscale: float,
                 unit: float, workers: TensorCollective, check_step: Any, remedy: str,
                 names: Sequence[str] | None) -> list[Any]:
    """:func:`average_gradients` through one flat buffer with its tally
    (:func:`.tally.allreduce`; ``unit``: what one rank's 1 becomes in the reduction)."""
    check = check_step is not None
    messages, step_tensor = _step_messages(names, len(tensors), check_step if check else 0,
                                           remedy)
    largest = float(np.finfo(tensors[0].dtype.as_numpy_dtype).max)
    reduced, numbers = tally.allreduce(
        tensors, workers, op="average" if average else "sum", prescale=prescale,
        postscale=postscale, step=step_tensor, check=check, messages=messages,
        limit=finite_bound_limit(largest, prescale=prescale, unit=unit))
    if not average:
        return reduced
    rechecked = (lambda rescaled: require_finite(rescaled, check_step, remedy, names)) \
        if check else None
    return _over_contributors(reduced, numbers[COUNT], unit, workers.size(), rechecked)


def _over_contributors(averaged: list[Any], count: Any, unit: float, ranks: int,
                       rechecked: Callable[[list[Any]], list[Any]] | None = None
                       ) -> list[Any]:
    """``averaged`` (the sum over ``ranks``, scaled by ``unit``) re-divided by the number
    of ranks that contributed, which the reduced ``count`` (their 1s, scaled by ``unit``)
    tells; unchanged when every rank did (the usual case: no pass over the gradients).
    ``rechecked``, when given, is applied to the re-divided gradients (the non-finite
    check of values the flat buffer's bound no longer covers)."""
    contributors = ops.cast(count, "float32") / unit

    def rescale() -> list[Any]:
        factor = joined_rescale(contributors, ranks, maximum=ops.maximum)
        rescaled = [g * ops.cast(factor, g.dtype) for g in averaged]
        return rescaled if rechecked is None else rechecked(rescaled)

    return ops.cond(some_ranks_joined(contributors, ranks), rescale, lambda: list(averaged))


def all_finite(tensors: Sequence[Any]) -> Any:
    """A boolean tensor: no element of ``tensors`` is NaN or Inf.

    The tensors are summed first: NaN and Inf survive addition, so a finite sum proves
    every element finite, in one read of the tensors (an exact test writes a mask per
    tensor and reads it again). Only a sum that is not finite (a NaN or Inf, or finite
    values whose sum overflows) is followed by the exact test, which decides.
    """

    def exact() -> Any:
        return ops.all(ops.stack([ops.all(ops.isfinite(t)) for t in tensors]))

    total = ops.sum(ops.stack([ops.cast(ops.sum(t), "float32") for t in tensors]))
    return ops.cond(ops.isfinite(total), lambda: ops.convert_to_tensor(True), exact)


def require_finite(grads: Sequence[Any], step: Any, remedy: str = SKIP_REMEDY,
                   names: Sequence[str] | None = None) -> list[Any]:
    """``grads`` unchanged, after stopping training if any holds a NaN or Inf, with
    hvdtrain's message naming the step and the first such gradient's variable (from
    ``names``, one per gradient) and ending with ``remedy``.

    Inside a TensorFlow graph (a ``tf.function``, as in ``fit``) this fails the graph
    with ``InvalidArgumentError`` (``HvdtrainRequireFinite``; where hvdtrain's ops are
    not loaded, on a GPU, a graph assertion that does not name the variable); elsewhere
    (eager, the torch backend) it raises
    :class:`hvdtrain.nonfinite.NonFiniteGradientError`.
    """
    present = [g for g in grads if g is not None]
    named = None if names is None else [n for n, g in zip(names, grads, strict=True)
                                        if g is not None]
    if backend.in_tensorflow_graph() and tally.native_ops() is not None:
        messages, step_tensor = _step_messages(named, len(present), step, remedy)
        checked = iter(tally.require_finite_natively(present, step_tensor, messages))
        return [None if g is None else next(checked) for g in grads]
    if backend.in_tensorflow_graph():
        import tensorflow as tf

        message = nonfinite_gradient_message(_STEP_PLACEHOLDER, remedy=remedy)
        before, after = message.split(_STEP_PLACEHOLDER)
        check = tf.debugging.Assert(all_finite(present), [f"hvdtrain: {before}", step, after])
        with tf.control_dependencies([check]):
            return [None if g is None else tf.identity(g) for g in grads]
    if not bool(all_finite(present)):
        parameter = None if not named else next(
            n for n, g in zip(named, present, strict=True) if not bool(ops.all(ops.isfinite(g))))
        raise NonFiniteGradientError(nonfinite_gradient_message(
            step if isinstance(step, str) else int(step), parameter, remedy))
    return list(grads)


def variable_names(variables: Sequence[Any], unnamed: str = "variables") -> list[str]:
    """What the non-finite error calls each variable: its Keras ``path``, else its name,
    else its place (``unnamed[i]``)."""
    return [getattr(v, "path", None) or getattr(v, "name", None) or f"{unnamed}[{i}]"
            for i, v in enumerate(variables)]


def _step_messages(names: Sequence[str] | None, count: int, step: Any, remedy: str
                   ) -> tuple[list[str], Any]:
    """The non-finite error's message for each of ``count`` gradients (naming its
    variable when ``names`` are known) with the ``{step}`` that hvdtrain's ops replace,
    and the step to give them; a step that is text (not known) is written in, and 0
    given."""
    messages = ["hvdtrain: " + nonfinite_gradient_message(
        _STEP_PLACEHOLDER, None if names is None else names[i], remedy) for i in range(count)]
    if isinstance(step, str):
        return [m.replace(_STEP_PLACEHOLDER, step) for m in messages], 0
    return messages, step


def finite_on_every_rank(grads: Sequence[Any]) -> Any:
    """A boolean tensor, the same on every rank: no rank sees a NaN or Inf in ``grads``
    (:func:`hvdtrain.collective.any_rank`, the vote every adapter takes)."""
    present = [g for g in grads if g is not None]
    flag = ops.reshape(ops.cast(ops.logical_not(all_finite(present)), "float32"), [1])
    nonfinite = any_rank(flag, backend.tensors(), "hvdtrain.nonfinite")
    return ops.logical_not(ops.reshape(nonfinite, []))


def sum_over_ranks(tensor: Any, name: str) -> Any:
    """The sum of ``tensor`` over all ranks, differentiable (its gradient is the sum of
    the ranks' gradients); ``name`` pairs the collective across ranks."""
    workers = backend.tensors()
    return workers.wait(workers.allreduce(tensor, name))


def dense(gradient: Any) -> Any:
    """``gradient`` as a dense tensor. Embedding layers give tf.IndexedSlices on TensorFlow,
    which keras.ops.convert_to_tensor keeps sparse, and Horovod would allgather them (no
    allreduce, so no join and no count of contributors)."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.convert_to_tensor(gradient)
    return ops.convert_to_tensor(gradient)


class BFloat16Codec:
    """Horovod's compressor interface, on either Keras backend, for bfloat16 on the
    wire: floating-point tensors travel as bfloat16 (reduced natively by a Horovod with
    hvdtrain's patch 0011-bfloat16) and come back in their own dtype."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        """``tensor`` as bfloat16 (when it is floating point), and its dtype."""
        dtype = keras.backend.standardize_dtype(tensor.dtype)
        if "float" in dtype and dtype != "bfloat16":
            return ops.cast(tensor, "bfloat16"), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor: Any, dtype: Any) -> Any:
        """``tensor`` back in ``dtype``, the dtype :meth:`compress` was given."""
        return tensor if keras.backend.standardize_dtype(tensor.dtype) == dtype \
            else ops.cast(tensor, dtype)


def _bf16_reduce(tensors: list[Any], average: bool, workers: TensorCollective) -> list[Any]:
    """The sum (or average) of ``tensors`` over the workers with bfloat16 on the wire:
    through an allgather (a Horovod without hvdtrain's bfloat16 patch reduces no
    bfloat16), added in rank order."""
    dtype = tensors[0].dtype
    flat = ops.concatenate([ops.reshape(ops.cast(t, "float32"), [-1]) for t in tensors])
    bits = backend.bitcast16(ops.cast(flat, "bfloat16"), "int16")
    gathered = workers.wait(workers.allgather(ops.reshape(bits, [1, -1]),
                                              "hvdtrain.gradients.bf16"))
    values = ops.cast(backend.bitcast16(gathered, "bfloat16"), "float32")
    total = ops.sum(values, axis=0)
    if average:
        total = total / ops.cast(ops.shape(values)[0], "float32")
    sizes = [int(np.prod(t.shape)) for t in tensors]
    pieces = ops.split(total, np.cumsum(sizes)[:-1].tolist()) if len(sizes) > 1 else [total]
    return [ops.cast(ops.reshape(p, t.shape), dtype) for p, t in zip(pieces, tensors, strict=True)]

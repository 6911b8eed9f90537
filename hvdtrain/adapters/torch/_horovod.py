"""What the torch adapter takes from Horovod: its workers as a
:class:`hvdtrain.collective.Collective` (all of them, or one process set's), and every
private Horovod API the adapter relies on, in one place.

Checked against Horovod 0.28.1 (:data:`CHECKED_VERSION`, the version in
constraints.txt); look here first when another Horovod breaks the adapter. On import,
:func:`require_private_apis` checks that each name below exists, so a Horovod without
one fails with a message naming it instead of an AttributeError mid-training.

The distributed optimizer uses Horovod's public collectives only (:mod:`.hooks`). The
private APIs: ``horovod.torch.elastic.TorchState._handlers`` (:mod:`.elastic`: the
warmup gets a handler of its own) and ``horovod.common.elastic.run_fn`` (the elastic loop, which
``hvt.elastic.run`` wraps with a bounded reset).
"""

from __future__ import annotations

import pickle
import warnings
from dataclasses import dataclass
from typing import Any

import horovod
import horovod.torch as hvd
import torch
from horovod.common import elastic as _common_elastic
from horovod.torch import elastic as _torch_elastic

from hvdtrain import watchdog
from hvdtrain.collective import Collective, HorovodCollective, ReduceOp, TensorCollective
from hvdtrain.step_events import StepObservers, observers_of

CHECKED_VERSION = "0.28.1"
PRIVATE_APIS: dict[str, tuple[object, tuple[str, ...]]] = {
    "horovod.common.elastic": (_common_elastic, ("run_fn",)),
    "horovod.torch.elastic": (_torch_elastic, ("TorchState", "ElasticSampler")),
}

_ALL_WORKERS: Collective = HorovodCollective(hvd, "hvt.init()")


def require_private_apis() -> None:
    """Raise ImportError naming what is missing unless the installed Horovod has every
    private API listed above; warn once when its version is not the one checked."""
    missing = [f"{owner}.{name}" for owner, (value, names) in PRIVATE_APIS.items()
               for name in names if not hasattr(value, name)]
    if missing:
        raise ImportError(
            f"hvdtrain's torch adapter relies on Horovod internals that Horovod "
            f"{horovod.__version__} lacks: {', '.join(missing)}. Install Horovod "
            f"{CHECKED_VERSION} (scripts/build-horovod.sh --install)")
    if horovod.__version__ != CHECKED_VERSION:
        warnings.warn(
            f"hvdtrain's torch adapter was checked against Horovod {CHECKED_VERSION}'s "
            f"internals (hvdtrain/adapters/torch/_horovod.py), not {horovod.__version__}'s",
            stacklevel=2)


@dataclass(frozen=True)
class ProcessSetCollective:
    """The ranks of one Horovod process set as a :class:`~hvdtrain.collective.Collective`."""

    process_set: hvd.ProcessSet
    init_call: str = "hvt.init()"

    def is_initialized(self) -> bool:
        return bool(hvd.is_initialized())

    def rank(self) -> int:
        return int(self.process_set.rank())

    def size(self) -> int:
        return int(self.process_set.size())

    def allgather_object(self, value: Any, name: str) -> list[Any]:
        """Horovod's ``allgather_object`` has no ``process_set`` argument: the pickled
        bytes and their lengths go by two allgathers."""
        data = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8)
        lengths = hvd.allgather(torch.tensor([data.numel()]), name=f"{name}.lengths",
                                process_set=self.process_set)
        gathered = hvd.allgather(data, name=f"{name}.data", process_set=self.process_set)
        return [pickle.loads(part.numpy().tobytes())
                for part in torch.split(gathered, lengths.tolist())]

    def broadcast_object(self, value: Any, root_rank: int, name: str) -> Any:
        return hvd.broadcast_object(value, root_rank=root_rank, name=name,
                                    process_set=self.process_set)


def collective(process_set: hvd.ProcessSet = hvd.global_process_set) -> Collective:
    """The workers of ``process_set`` (all of them by default) as the core's
    :class:`~hvdtrain.collective.Collective`; each adapter has its ``collective()``."""
    return _ALL_WORKERS if process_set == hvd.global_process_set else \
        ProcessSetCollective(process_set)


_HOROVOD_OPS = {"sum": hvd.Sum, "average": hvd.Average, "min": hvd.Min, "max": hvd.Max}


@dataclass(frozen=True)
class TorchTensors:
    """The ranks of one Horovod process set as the core's
    :class:`~hvdtrain.collective.TensorCollective`: Horovod's asynchronous torch
    operations (allreduce and broadcast in place), each handle awaited by
    :meth:`wait` (``horovod.torch.synchronize``)."""

    process_set: hvd.ProcessSet = hvd.global_process_set

    def size(self) -> int:
        return int(self.process_set.size())

    def allreduce(self, tensor: torch.Tensor, name: str, *, op: ReduceOp = "sum",
                  prescale: float = 1.0, postscale: float = 1.0) -> Any:
        return hvd.allreduce_async_(tensor, name=name, op=_HOROVOD_OPS[op],
                                    prescale_factor=prescale, postscale_factor=postscale,
                                    process_set=self.process_set)

    def grouped_allreduce(self, tensors: list[torch.Tensor], name: str, *,
                          op: ReduceOp = "sum") -> Any:
        """Horovod's grouped allreduce of ``tensors`` in place (one negotiation for all of
        them); :meth:`wait` gives the list of results."""
        return hvd.grouped_allreduce_async_(tensors, name=name, op=_HOROVOD_OPS[op],
                                            process_set=self.process_set)

    def reduce_scatter(self, rows: torch.Tensor, name: str, *, op: ReduceOp = "sum",
                       prescale: float = 1.0, postscale: float = 1.0) -> Any:
        return hvd.reducescatter_async(rows, name=name, op=_HOROVOD_OPS[op],
                                       prescale_factor=prescale, postscale_factor=postscale,
                                       process_set=self.process_set)

    def allgather(self, tensor: torch.Tensor, name: str) -> Any:
        return hvd.allgather_async(tensor, name=name, process_set=self.process_set)

    def broadcast(self, tensor: torch.Tensor, root_rank: int, name: str) -> Any:
        return hvd.broadcast_async_(tensor, root_rank, name=name, process_set=self.process_set)

    def wait(self, handle: Any) -> torch.Tensor:
        return hvd.synchronize(handle)


def tensors(process_set: hvd.ProcessSet = hvd.global_process_set) -> TensorCollective:
    """The workers of ``process_set`` (all of them by default) moving tensors, as the
    core's :class:`~hvdtrain.collective.TensorCollective`; each adapter has its
    ``tensors()``."""
    return TorchTensors(process_set)


def allreduce_numbers(values: list[float], op: ReduceOp, name: str,
                      process_set: hvd.ProcessSet, what: str) -> list[float]:
    """Each of ``values`` reduced by ``op`` over the ranks of ``process_set`` (one
    float64 allreduce under the watchdog, which names it ``what`` if it hangs)."""
    workers = tensors(process_set)
    with watchdog.guard(what):
        return workers.wait(workers.allreduce(torch.tensor(values, dtype=torch.float64), name,
                                              op=op)).tolist()


def allreduce_number(value: float, op: ReduceOp, name: str, process_set: hvd.ProcessSet,
                     what: str) -> float:
    """``value`` reduced by ``op`` over the ranks of ``process_set``
    (:func:`allreduce_numbers`)."""
    return allreduce_numbers([value], op, name, process_set, what)[0]


def observers_for(process_set: hvd.ProcessSet) -> StepObservers:
    """The core's step observers, when a reduction over ``process_set`` spans the job
    (:func:`hvdtrain.step_events.observers_of`)."""
    return observers_of(process_set.size(), hvd.size())


def sum_numbers(numbers: list[float], name: str) -> list[float]:
    """Each number summed over every rank: the exchange of :mod:`hvdtrain.step_timing`."""
    return allreduce_numbers(numbers, "sum", name, hvd.global_process_set,
                             "the step-time exchange")


require_private_apis()

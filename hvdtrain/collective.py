"""The one seam between hvdtrain's core and a framework's communication.

A :class:`Collective` is what the core needs from a worker group: whether it is
connected, this worker's rank, the group's size, and an allgather and a broadcast of
Python objects. Each adapter gives its own with a function of one name, ``collective()``:
:class:`HorovodCollective` over ``horovod.torch`` (the torch adapter's
``_horovod.collective(process_set)``, one per Horovod process set) or over the Horovod
that matches Keras's backend (``keras.backend.collective()``, for the Keras and
TensorFlow adapters), and an mpi4py communicator's (``numpy.collective()``). Beside
it, each adapter's ``tensors()`` is a :class:`TensorCollective`: the same workers moving
tensors (the averaged step's allreduce, reduce-scatter, allgather and broadcast). The
core's functions that need every rank take a :class:`Collective`: :func:`require_initialized`,
:func:`gather` and :func:`broadcast` (both under :mod:`hvdtrain.watchdog`),
:func:`on_rank0_for_all`,
:func:`hvdtrain.consistency.check_ranks_agree`, :func:`hvdtrain.replicas.verify_checksums`
and :func:`hvdtrain.metrics.average_over_ranks`.

>>> class Alone:  # one worker, as a test double or a script without a launcher
...     init_call = "init()"
...     def is_initialized(self): return True
...     def rank(self): return 0
...     def size(self): return 1
...     def allgather_object(self, value, name): return [value]
...     def broadcast_object(self, value, root_rank, name): return value
>>> gather(Alone(), {"lr": 0.1}, "example")
[{'lr': 0.1}]
>>> on_rank0_for_all(Alone(), lambda: "written", "write a file", "example")
'written'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, Protocol, TypeVar

from hvdtrain.watchdog import guard

_Result = TypeVar("_Result")


class Collective(Protocol):
    """A group of workers as hvdtrain's core sees it.

    Attributes:
        init_call: how the user connects the workers, for messages (``"hvt.init()"``).
    """

    init_call: str

    def is_initialized(self) -> bool:
        """Whether the workers are connected."""

    def rank(self) -> int:
        """This worker's rank in the group."""

    def size(self) -> int:
        """The number of workers in the group."""

    def allgather_object(self, value: Any, name: str) -> list[Any]:
        """Every worker's picklable ``value``, in rank order; ``name`` pairs the call
        across workers."""

    def broadcast_object(self, value: Any, root_rank: int, name: str) -> Any:
        """``root_rank``'s ``value`` on every worker."""


ReduceOp = Literal["sum", "average", "min", "max"]
"""How :meth:`TensorCollective.allreduce` combines the workers' values."""


class TensorCollective(Protocol):
    """The tensor collectives of the averaged step over a group of workers, beside
    :class:`Collective` (which moves Python objects).

    Each adapter implements it once, as its ``tensors()``: the torch adapter over
    ``horovod.torch`` (asynchronous, reducing in place), the Keras and TensorFlow
    adapters over the Horovod of Keras's backend (in graphs too), the NumPy adapter
    over mpi4py. The adapters' optimizers and the vote (:func:`any_rank`)
    move their tensors through it. Each operation returns a handle that :meth:`wait`
    turns into the result; an implementation whose operations complete at once returns
    the result as the handle. ``name`` pairs a call across workers; ``prescale`` and
    ``postscale`` multiply each worker's values before the reduction and the result
    after it (Horovod's factors).
    """

    def size(self) -> int:
        """The number of workers in the group."""

    def allreduce(self, tensor: Any, name: str, *, op: ReduceOp = "sum",
                  prescale: float = 1.0, postscale: float = 1.0) -> Any:
        """``tensor`` combined over the workers by ``op`` ("average": the sum over
        :meth:`size`)."""

    def reduce_scatter(self, rows: Any, name: str, *, op: ReduceOp = "sum",
                       prescale: float = 1.0, postscale: float = 1.0) -> Any:
        """``rows`` (one row per worker, :meth:`size` rows) summed (or averaged) over the
        workers; each worker receives its own row of the result."""

    def allgather(self, tensor: Any, name: str) -> Any:
        """Every worker's ``tensor``, concatenated along the first axis in rank order."""

    def broadcast(self, tensor: Any, root_rank: int, name: str) -> Any:
        """``root_rank``'s ``tensor`` on every worker."""

    def wait(self, handle: Any) -> Any:
        """The result of the operation that returned ``handle``."""


@dataclass(frozen=True)
class HorovodCollective:
    """A Horovod framework module (``horovod.torch``, ``horovod.tensorflow``) as a
    :class:`Collective` over all of its workers."""

    horovod: ModuleType
    init_call: str

    def is_initialized(self) -> bool:
        return bool(self.horovod.is_initialized())

    def rank(self) -> int:
        return int(self.horovod.rank())

    def size(self) -> int:
        return int(self.horovod.size())

    def allgather_object(self, value: Any, name: str) -> list[Any]:
        return list(self.horovod.allgather_object(value, name=name))

    def broadcast_object(self, value: Any, root_rank: int, name: str) -> Any:
        return self.horovod.broadcast_object(value, root_rank=root_rank, name=name)


def require_initialized(collective: Collective, what: str) -> None:
    """Raise RuntimeError naming ``what`` and the init to call unless the workers are
    connected."""
    if not collective.is_initialized():
        raise RuntimeError(
            f"{what} needs the workers connected: call {collective.init_call} first")


def gather(collective: Collective, value: Any, name: str) -> list[Any]:
    """Every worker's picklable ``value``, in rank order, while the collective watchdog
    (:func:`hvdtrain.watchdog.guard`) watches the wait; ``name`` pairs the call across
    workers."""
    with guard(f"the allgather of {name}"):
        return collective.allgather_object(value, name)


def broadcast(collective: Collective, value: Any, name: str, root_rank: int = 0) -> Any:
    """``root_rank``'s picklable ``value`` on every worker, while the collective watchdog
    watches the wait; ``name`` pairs the call across workers."""
    with guard(f"the broadcast of {name} from rank {root_rank}"):
        return collective.broadcast_object(value, root_rank, name)


def on_rank0_for_all(collective: Collective, action: Callable[[], _Result], what: str,
                     name: str) -> _Result | None:
    """Run ``action`` on rank 0 only and raise its failure on every rank.

    Every worker must call this (one object broadcast, named ``name``).

    Args:
        collective: the workers.
        action: what rank 0 does (write or read a file).
        what: the action in words, for the error ("write checkpoint run/ckpt.pt").
        name: the broadcast's name, the same on every worker.

    Returns:
        The action's result on rank 0, None elsewhere.

    Raises:
        RuntimeError: on every rank, naming ``what`` and rank 0's error, so that the
            other ranks do not run on into a hang.
    """
    error, result = None, None
    if collective.rank() == 0:
        try:
            result = action()
        except Exception as failure:
            error = f"{type(failure).__name__}: {failure}"
    error = broadcast(collective, error, name)
    if error:
        raise RuntimeError(f"rank 0 could not {what}: {error}")
    return result


def any_rank(flag: Any, tensors: TensorCollective, name: str) -> Any:
    """Whether some rank raised its ``flag``: a one-element tensor of the adapter's
    holding 1 where this rank's condition holds, 0 where not, summed over the ranks by
    one allreduce through ``tensors`` (named ``name``). The answer, a boolean tensor,
    is the same on every rank."""
    return tensors.wait(tensors.allreduce(flag, name, op="sum")) > 0

"""Data-parallel training on NumPy arrays over MPI: ``import hvdtrain.adapters.numpy as hvn``.

For models written on plain arrays (hand-written NumPy, JAX on the CPU, anything
that hands out NumPy arrays). Collectives go through mpi4py's buffer-protocol calls
(``Allreduce``, ``Bcast``: no pickling of the data), so launch with an MPI launcher:
``horovodrun --mpi -np 2 python train.py`` or ``mpirun -np 2 python train.py``.
Under ``horovodrun --gloo`` the processes share no MPI world, and :func:`init` says so
instead of letting each process train alone. Run without a launcher, it is one worker.

Example::

    import numpy as np
    import hvdtrain.adapters.numpy as hvn

    hvn.init()
    weights = [np.zeros((64, 10)), np.zeros(10)]
    hvn.broadcast_in_place(weights)                 # every rank starts as rank 0
    optimizer = hvn.DistributedSGD(weights, lr=0.05, momentum=0.9)
    scheduler = hvn.LinearScalingWarmup(optimizer, batch_size_per_worker=32,
                                        steps_per_epoch=100)
    for x, y in my_shard_batches():
        optimizer.step(gradients(weights, x, y))    # averaged over workers, applied in place
        scheduler.step()
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Unpack

import numpy as np

from hvdtrain import runtime, step_timing, watchdog
from hvdtrain.collective import Collective, ReduceOp, TensorCollective, require_initialized
from hvdtrain.consistency import RankDisagreementError, check_ranks_agree, software_versions
from hvdtrain.nonfinite import PLAIN_REMEDY, NonFiniteGradientError, nonfinite_gradient_message
from hvdtrain.replicas import ReplicaMismatchError, checksums, verify_checksums
from hvdtrain.runtime import announce_single_worker, launcher_size
from hvdtrain.step_events import step_observers
from hvdtrain.validation import require_instance, require_root_rank
from hvdtrain.warmup import WarmupArguments, WarmupSettings, check_warmup_agreement

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = [
    "DistributedSGD", "LinearScalingWarmup", "NonFiniteGradientError", "RankDisagreementError",
    "ReplicaMismatchError", "allreduce_mean", "broadcast", "broadcast_in_place", "init", "rank",
    "set_samples_per_step", "size", "step_times", "verify_replicas",
]

_communicator: MPI.Comm | None = None


def init(comm: MPI.Comm | None = None) -> None:
    """Start using ``comm`` (default: every process of the MPI job) for all collectives.

    Pass a sub-communicator (``MPI.COMM_WORLD.Split(...)``) to train several
    independent data-parallel groups in one job.

    Raises:
        RuntimeError: when launched by ``horovodrun --gloo`` (or any launcher that
            starts processes outside one MPI world), saying how to launch instead.
    """
    global _communicator
    runtime.apply_runtime_defaults(accelerator=False, idle_wait=False)
    MPI = _mpi()
    launched = launcher_size() or 1
    world = MPI.COMM_WORLD.Get_size()
    if comm is None and launched > 1 and world != launched:
        raise RuntimeError(
            f"the launcher started {launched} processes, but MPI sees a world of {world}: "
            "this looks like `horovodrun --gloo`, whose processes share no MPI world. "
            "hvdtrain.adapters.numpy needs MPI: run `horovodrun --mpi -np N ...` or "
            "`mpirun -np N ...`"
        )
    watchdog.timeout_seconds()  # a malformed limit fails before any worker starts waiting
    _communicator = comm if comm is not None else MPI.COMM_WORLD
    announce_single_worker()
    watchdog.start(_communicator.Get_rank(), _communicator.Get_size())
    step_timing.start(_ALL_WORKERS, _sum_numbers)


def _sum_numbers(numbers: list[float], name: str) -> list[float]:
    """Each number summed over every worker: the exchange of :mod:`hvdtrain.step_timing`."""
    with watchdog.guard("the step-time exchange"):
        return _ALL_TENSORS.allreduce(np.array(numbers, np.float64), name).tolist()


step_times = step_timing.step_times
set_samples_per_step = step_timing.set_samples_per_step


def _mpi():
    """mpi4py's MPI module. mpi4py starts MPI when it is first imported, and MPI reads its
    settings when it starts, so :func:`init` sets hvdtrain's defaults before the first
    import here (a script that imported mpi4py itself started MPI before them)."""
    from mpi4py import MPI

    return MPI


class _MpiCollective:
    """The communicator given to :func:`init` as a :class:`hvdtrain.collective.Collective`
    (mpi4py's pickled ``allgather`` and ``bcast``)."""

    init_call = "hvn.init()"

    def is_initialized(self) -> bool:
        return _communicator is not None

    def rank(self) -> int:
        return _comm().Get_rank()

    def size(self) -> int:
        return _comm().Get_size()

    def allgather_object(self, value: Any, name: str) -> list[Any]:
        return _comm().allgather(value)

    def broadcast_object(self, value: Any, root_rank: int, name: str) -> Any:
        return _comm().bcast(value, root=root_rank)


_ALL_WORKERS = _MpiCollective()


def collective() -> Collective:
    """The workers as the core's :class:`~hvdtrain.collective.Collective` (each adapter
    has its ``collective()``)."""
    return _ALL_WORKERS


class _MpiTensors:
    """The communicator given to :func:`init` as the core's
    :class:`~hvdtrain.collective.TensorCollective`: mpi4py's buffer collectives on NumPy
    arrays, each blocking, so each result is its own handle."""

    def size(self) -> int:
        return _comm().Get_size()

    def allreduce(self, tensor: np.ndarray, name: str, *, op: ReduceOp = "sum",
                  prescale: float = 1.0, postscale: float = 1.0) -> np.ndarray:
        data = np.ascontiguousarray(tensor)
        if prescale != 1.0:
            data = data * prescale
        total = np.empty_like(data)
        _comm().Allreduce(data, total, op=_mpi_op(op))
        if op == "average":
            total /= self.size()
        if postscale != 1.0:
            total *= postscale
        return total

    def reduce_scatter(self, rows: np.ndarray, name: str, *, op: ReduceOp = "sum",
                       prescale: float = 1.0, postscale: float = 1.0) -> np.ndarray:
        data = np.ascontiguousarray(rows) * prescale
        row = np.empty_like(data[0])
        _comm().Reduce_scatter_block(data, row, op=_mpi_op(op))
        return row * (postscale / (self.size() if op == "average" else 1))

    def allgather(self, tensor: np.ndarray, name: str) -> np.ndarray:
        data = np.ascontiguousarray(tensor)
        gathered = np.empty((self.size(), *data.shape), dtype=data.dtype)
        _comm().Allgather(data, gathered)
        return gathered.reshape(-1, *data.shape[1:])

    def broadcast(self, tensor: np.ndarray, root_rank: int, name: str) -> np.ndarray:
        data = np.array(tensor, copy=True, order="C")
        _comm().Bcast(data, root=root_rank)
        return data

    def wait(self, handle: np.ndarray) -> np.ndarray:
        return handle


def _mpi_op(op: ReduceOp) -> MPI.Op:
    """MPI's reduction for ``op`` ("average" is MPI's sum, divided afterwards)."""
    mpi = _mpi()
    return {"min": mpi.MIN, "max": mpi.MAX}.get(op, mpi.SUM)


_ALL_TENSORS = _MpiTensors()


def tensors() -> TensorCollective:
    """The workers moving arrays, as the core's
    :class:`~hvdtrain.collective.TensorCollective` (each adapter has its ``tensors()``)."""
    return _ALL_TENSORS


def _comm() -> MPI.Comm:
    require_initialized(_ALL_WORKERS, "hvdtrain.adapters.numpy")
    return _communicator


def rank() -> int:
    """This process's rank in the communicator given to :func:`init`."""
    return _comm().Get_rank()


def size() -> int:
    """The number of workers in the communicator given to :func:`init`."""
    return _comm().Get_size()


def _contiguous(array: Any, what: str) -> np.ndarray:
    """A C-contiguous array with the same values (a copy only when needed)."""
    data = np.asarray(array)
    if data.dtype == object:
        raise TypeError(f"{what} needs a numeric array, got dtype=object")
    return np.ascontiguousarray(data)


def allreduce_mean(array: Any) -> np.ndarray:
    """The element-wise mean of ``array`` over all workers, as a new array, on every rank.

    Floating arrays keep their dtype; integer and boolean arrays are summed exactly
    (in int64) and the mean is float64. Non-contiguous input is copied first. Every
    rank must pass the same shape and dtype (a mismatch raises ValueError on every rank).
    """
    data = _contiguous(array, "allreduce_mean")
    check_ranks_agree(collective(), {"array shape": data.shape, "array dtype": data.dtype.str},
                      "allreduce_mean", name="allreduce_mean's shapes and dtypes")
    if not np.issubdtype(data.dtype, np.floating):
        data = data.astype(np.int64)
    with watchdog.guard("allreduce_mean's Allreduce"):
        total = _ALL_TENSORS.allreduce(data, "allreduce_mean")
    if np.issubdtype(total.dtype, np.floating):
        total /= size()
        return total
    return total / size()


def broadcast(array: Any, root_rank: int = 0) -> np.ndarray:
    """``root_rank``'s array, as a new array, on every rank (other ranks may pass None)."""
    comm = _comm()
    require_root_rank(root_rank, comm.Get_size())
    data = _contiguous(array, "broadcast") if comm.Get_rank() == root_rank else None
    with watchdog.guard(f"a broadcast from rank {root_rank}"):
        shape, dtype = comm.bcast((data.shape, data.dtype.str) if data is not None else None,
                                  root=root_rank)
        if data is None:
            data = np.empty(shape, dtype=np.dtype(dtype))
        data = _ALL_TENSORS.broadcast(data, root_rank, "broadcast")
    return data


def broadcast_in_place(arrays: Iterable[np.ndarray], root_rank: int = 0) -> None:
    """Overwrite each (writeable) array with ``root_rank``'s values, on every rank."""
    for array in arrays:
        if not isinstance(array, np.ndarray) or not array.flags.writeable:
            raise TypeError("broadcast_in_place needs writeable NumPy arrays")
        array[...] = broadcast(array, root_rank).reshape(array.shape)


class DistributedSGD:
    """SGD (with optional momentum) whose ``step`` applies worker-averaged gradients in place.

    All gradients of a step are averaged in one fused ``Allreduce``. The update is
    PyTorch's form, v = momentum·v + g; p -= lr·v, so changing ``lr`` needs no momentum
    correction. At construction the ranks' parameter shapes and dtypes are compared.

    Example::

        optimizer = hvn.DistributedSGD([w, b], lr=0.1, momentum=0.9)
        optimizer.step([grad_w, grad_b])
    """

    def __init__(self, params: Sequence[np.ndarray], lr: float, momentum: float = 0.0) -> None:
        self.params = list(params)
        for i, p in enumerate(self.params):
            if not isinstance(p, np.ndarray) or not np.issubdtype(p.dtype, np.floating) \
                    or not p.flags.writeable:
                raise TypeError(f"params[{i}] must be a writeable floating-point NumPy array")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr!r}")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.velocity = [np.zeros_like(p) for p in self.params]
        self._wire_dtype = np.result_type(*self.params) if self.params else np.float64
        self.steps_taken = 0
        facts = {f"params[{i}] (shape, dtype)": (p.shape, p.dtype.str)
                 for i, p in enumerate(self.params)}
        check_ranks_agree(collective(), {**facts, "number of parameters": len(self.params),
                                       "lr": self.lr, "momentum": self.momentum,
                                       **software_versions("numpy", "mpi4py")},
                          "DistributedSGD", name="DistributedSGD's settings")

    def step(self, grads: Sequence[np.ndarray]) -> None:
        """Average ``grads`` (one per parameter, same shapes) over workers and apply them."""
        if len(grads) != len(self.params):
            raise ValueError(f"step got {len(grads)} gradients for {len(self.params)} parameters")
        for i, (g, p) in enumerate(zip(grads, self.params, strict=True)):
            if np.shape(g) != p.shape:
                raise ValueError(f"grads[{i}] has shape {np.shape(g)}, its parameter {p.shape}")
        if step_observers:
            step_observers.reduction_started(self.steps_taken)
        averaged = self._averaged(grads)
        if step_observers:
            step_observers.reduction_finished(self.steps_taken)
        step, self.steps_taken = self.steps_taken, self.steps_taken + 1
        for i, g in enumerate(averaged):
            if not np.isfinite(g).all():
                raise NonFiniteGradientError(
                    nonfinite_gradient_message(step, f"params[{i}]", PLAIN_REMEDY))
        for p, v, g in zip(self.params, self.velocity, averaged, strict=True):
            if self.momentum:
                v *= self.momentum
                v += g
                g = v
            p -= self.lr * g
        if step_observers:
            step_observers.step_finished(step, applied=True)

    def _averaged(self, grads: Sequence[np.ndarray]) -> list[np.ndarray]:
        flat = np.concatenate([np.asarray(g, dtype=self._wire_dtype).reshape(-1) for g in grads])
        with watchdog.guard(f"the gradient Allreduce of step {self.steps_taken}"):
            total = _ALL_TENSORS.allreduce(flat, "hvdtrain.gradients", op="average")
        pieces = np.split(total, np.cumsum([p.size for p in self.params])[:-1])
        return [piece.reshape(p.shape).astype(p.dtype, copy=False)
                for piece, p in zip(pieces, self.params, strict=True)]

    def state_dict(self) -> dict[str, Any]:
        """Learning rate, momentum and velocity buffers (copies), for checkpoints."""
        return {"lr": self.lr, "momentum": self.momentum,
                "velocity": [v.copy() for v in self.velocity]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lr, self.momentum = float(state["lr"]), float(state["momentum"])
        for v, saved in zip(self.velocity, state["velocity"], strict=True):
            v[...] = saved


class LinearScalingWarmup:
    """Goyal et al.'s linear scaling rule and warmup for :class:`DistributedSGD`.

    Call ``step()`` once per optimizer step; it sets ``optimizer.lr`` from
    :class:`hvdtrain.schedule.LinearScalingSchedule`, whose η is ``optimizer.lr`` when
    the scheduler is made. ``state_dict``/``load_state_dict`` resume exactly.
    """

    def __init__(self, optimizer: DistributedSGD, **settings: Unpack[WarmupArguments]) -> None:
        """Args: the optimizer (its ``lr`` is η), and the settings of
        :class:`hvdtrain.warmup.WarmupSettings` (``steps_per_epoch`` required)."""
        require_instance("optimizer", optimizer, DistributedSGD, "an hvn.DistributedSGD")
        warmup = WarmupSettings.of(**settings)
        self.optimizer = optimizer
        self.schedule = warmup.schedule(optimizer.lr, warmup.workers(collective()),
                                        steps_per_epoch=warmup.require_steps_per_epoch())
        check_warmup_agreement(collective(), self.schedule)
        self.steps_taken = 0
        optimizer.lr = self.schedule.lr_at(0)

    def step(self) -> None:
        """Advance one optimizer step and set the rate for the next one."""
        self.steps_taken += 1
        self.optimizer.lr = self.schedule.lr_at(self.steps_taken)

    def state_dict(self) -> dict[str, Any]:
        """The progress: optimizer steps taken."""
        return {"steps_taken": self.steps_taken}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``."""
        self.steps_taken = int(state["steps_taken"])
        self.optimizer.lr = self.schedule.lr_at(self.steps_taken)


def verify_replicas(arrays: Sequence[np.ndarray]) -> None:
    """Raise ReplicaMismatchError on every rank unless every rank's arrays are bit-identical."""
    require_instance("arrays", arrays, list | tuple, "a list or tuple of NumPy arrays")
    mine = checksums((f"array[{i}]", np.asarray(a)) for i, a in enumerate(arrays))
    verify_checksums(collective(), mine)

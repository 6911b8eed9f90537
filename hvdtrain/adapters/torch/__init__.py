"""PyTorch on Horovod: ``import hvdtrain.adapters.torch as hvt``.

A Horovod user switches by changing one import: every public name of
``horovod.torch`` is here, Horovod's own object (``rank``, ``size``, ``allreduce``,
``barrier``, ``broadcast_parameters``, process sets, ``SyncBatchNorm``, ...), except
:func:`init` (Horovod's, plus hvdtrain's runtime defaults),
:func:`DistributedOptimizer` (the same first arguments as
``horovod.torch.DistributedOptimizer``) and :func:`join` (Horovod's, then the step
timing starts its window anew). What hvdtrain adds, one module per concern:

- :mod:`.optimizer`: :func:`DistributedOptimizer` averages over accumulated
  micro-batches too when asked (``average_aggregated_gradients=True``; Horovod's
  default sums them), offers "bf16" compression, names the rank and parameter when
  models differ, and stops (or skips, on every rank alike) non-finite steps;
  :mod:`.averaging` is how it averages and checks; with ``shard_state=True`` each
  worker keeps a slice of the optimizer state (:mod:`.sharding`).
- :mod:`.consistency`: the checks of the named parameters and, at construction, that
  the ranks' models and settings agree (:class:`ParameterMismatchError`).
- :mod:`.scheduler`: :class:`LinearScalingWarmup`, Goyal et al.'s linear scaling rule
  and warmup (:mod:`hvdtrain.schedule`) as a torch ``LRScheduler``.
- :mod:`.replicas`: :func:`broadcast_state`, :func:`verify_replicas`, :func:`state_fingerprint`.
- :mod:`.checkpoint`: :func:`save_checkpoint`, :func:`load_checkpoint`.
- :mod:`.data`: :func:`distributed_sampler`, :func:`average_metrics`.
- :func:`step_times`: the last window of every rank's compute, wait and communication
  per step (:mod:`hvdtrain.step_timing`; rank 0 names a straggler on stderr);
  :func:`join` is Horovod's, starting that window anew.
- :mod:`.elastic` (``hvt.elastic``, in place of Horovod's module): ``run``,
  ``ElasticSampler`` and a ``TorchState`` whose warmup schedule follows the number of
  workers after each reset.

Example (run with ``horovodrun -np 2 python train.py``)::

    import torch
    import hvdtrain.adapters.torch as hvt

    hvt.init()
    model = torch.nn.Linear(10, 2)
    optimizer = hvt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         model.named_parameters())
    scheduler = hvt.LinearScalingWarmup(optimizer, batch_size_per_worker=32,
                                        steps_per_epoch=100)
    hvt.broadcast_state(model, optimizer, scheduler)
    for x, y in loader:                      # this worker's shard
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        scheduler.step()
"""

from __future__ import annotations

import horovod.torch as _hvd
import torch

# Every public name of horovod.torch 0.28.1 (but `init`, `DistributedOptimizer` and the
# `elastic` module, which are hvdtrain's), re-exported unchanged so that
# `import horovod.torch as hvd` scripts keep working with the import changed.
from horovod.torch import (
    Adasum,
    Average,
    Compression,
    HorovodInternalError,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    SyncBatchNorm,
    add_process_set,
    allgather,
    allgather_async,
    allgather_object,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
    ccl_built,
    check_extension,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    poll,
    rank,
    reducescatter,
    reducescatter_async,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    sparse_allreduce_async,
    start_timeline,
    stop_timeline,
    synchronize,
)

from hvdtrain import step_timing
from hvdtrain.adapters.torch import _horovod, elastic
from hvdtrain.adapters.torch.checkpoint import load_checkpoint, save_checkpoint
from hvdtrain.adapters.torch.consistency import ParameterMismatchError
from hvdtrain.adapters.torch.data import average_metrics, distributed_sampler
from hvdtrain.adapters.torch.optimizer import DistributedOptimizer, NonFiniteGradientError
from hvdtrain.adapters.torch.replicas import (
    ReplicaMismatchError,
    broadcast_state,
    state_fingerprint,
    verify_replicas,
)
from hvdtrain.adapters.torch.scheduler import LinearScalingWarmup
from hvdtrain.consistency import RankDisagreementError
from hvdtrain.runtime import init_horovod

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "LinearScalingWarmup",
    "Max",
    "Min",
    "NonFiniteGradientError",
    "ParameterMismatchError",
    "ProcessSet",
    "Product",
    "RankDisagreementError",
    "ReplicaMismatchError",
    "Sum",
    "SyncBatchNorm",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "average_metrics",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "broadcast_state",
    "ccl_built",
    "check_extension",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "distributed_sampler",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_initialized",
    "join",
    "load_checkpoint",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "save_checkpoint",
    "set_samples_per_step",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "start_timeline",
    "state_fingerprint",
    "step_times",
    "stop_timeline",
    "synchronize",
    "verify_replicas",
]


def init(comm=None, process_sets=None) -> None:
    """Horovod's ``init`` with hvdtrain's runtime defaults (:mod:`hvdtrain.runtime`: a
    stalled collective is reported, then the job shut down, instead of hanging).

    Args:
        comm: None (every process), a list of ranks, or an mpi4py communicator, to
            train several groups in one MPI job.
        process_sets: Horovod's process sets, passed through.

    Without a launcher it prints a one-line notice and runs as a single worker.
    """
    init_horovod(_hvd, comm, process_sets, accelerator=torch.cuda.is_available())
    step_timing.start(_horovod.collective(), _horovod.sum_numbers)


def join(device: int = -1) -> int:
    """Horovod's ``join``: wait until every rank has joined (meanwhile send zeros to the
    others' allreduces); returns the last rank to join. The step timing's window starts
    anew afterwards, on every rank at once (:mod:`hvdtrain.step_timing`)."""
    last = _hvd.join(device)
    step_timing.restart()
    return last


step_times = step_timing.step_times
set_samples_per_step = step_timing.set_samples_per_step

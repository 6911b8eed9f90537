"""Elastic training: Horovod's elastic mode, with the linear scaling rule following the
number of workers.

Launch with ``horovodrun --gloo --min-np M --max-np N --host-discovery-script S`` (on
one machine add ``--network-interfaces lo``). Workers may then leave (a crash, a
preempted host) or join while training goes on: Horovod rolls every worker back to
the last ``state.commit()``, re-forms the ring and calls :meth:`TorchState.sync`.
On top of Horovod's ``TorchState`` (model, optimizer, an :class:`ElasticSampler`,
plain extras), this one carries a :class:`~hvdtrain.adapters.torch.LinearScalingWarmup`:
after every reset it continues the rule for the new k from the samples seen so far.

Example (``examples/torch_elastic.py`` is a whole one)::

    sampler = hvt.elastic.ElasticSampler(dataset, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)
    state = hvt.elastic.TorchState(model, optimizer, warmup=scheduler,
                                   sampler=sampler, epoch=0)

    @hvt.elastic.run
    def train(state):
        while state.epoch < epochs:
            for batch, (x, y) in enumerate(loader):
                ...  # forward, backward, optimizer.step(), scheduler.step()
                sampler.record_batch(batch, 32)
                if batch % 10 == 0:
                    state.commit()
            # Count the epoch done before committing it: a reset right after the commit
            # must not run the epoch again.
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import horovod.torch as _hvd
import torch
from horovod.common.elastic import run_fn
from horovod.torch.elastic import ElasticSampler
from horovod.torch.elastic import TorchState as _HorovodTorchState

from hvdtrain import step_timing
from hvdtrain.adapters.torch.replicas import broadcast_tree
from hvdtrain.adapters.torch.scheduler import LinearScalingWarmup
from hvdtrain.adapters.torch.sharding import is_sharded
from hvdtrain.elastic import bounded_reset
from hvdtrain.trees import map_leaves
from hvdtrain.validation import require_instance

__all__ = ["ElasticSampler", "TorchState", "run"]


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``func(state, ...)`` through worker losses and additions (a decorator):
    Horovod's ``horovod.torch.elastic.run``, with each reset bounded.

    Before the first call and after every reset, ``state.sync()`` gives every worker
    rank 0's state. When a collective fails because a worker is gone, every worker
    goes back to ``state``'s last commit, Horovod is started again on the workers
    left, and ``func`` is called again; when hosts are added, the same from the
    commit that noticed them. A worker whose reset outlasts the elastic timeout (the
    job fell below ``--min-np`` and its launcher did not stop this worker) ends with
    a message saying so (:func:`hvdtrain.elastic.bounded_reset`).
    """
    return run_fn(func, bounded_reset(_reset))


def _reset() -> None:
    """Start Horovod again on the workers there are now, as Horovod's own reset does."""
    _hvd.shutdown()
    _hvd.init()
    step_timing.restart(new_workers=True)


class TorchState(_HorovodTorchState):
    """What an elastic torch job commits, restores after a failure and syncs to workers
    that join: the model, the optimizer, the warmup scheduler, the sampler's place in
    the epoch and any plain values (``epoch=0, batch=0``), exposed as attributes.

    Args:
        model: the model whose ``state_dict`` is kept (optional).
        optimizer: its optimizer (optional; the rates it holds are the warmup's).
        warmup: a :class:`~hvdtrain.adapters.torch.LinearScalingWarmup` (the Keras
            ``KerasState`` takes its own under the same name); after each reset it is
            given rank 0's progress and the new world size
            (:meth:`~hvdtrain.adapters.torch.LinearScalingWarmup.set_world_size`), so
            the rate follows the rule for the new k at the same point in epochs.
        sampler: an :class:`ElasticSampler` (Horovod's): on a reset it shares what is
            left of the epoch among the new set of workers. Call its
            ``record_batch(batch, batch_size)`` after each step.
        **extras: plain Python values kept and synced with the rest.

    Raises:
        TypeError: when ``warmup`` is not a LinearScalingWarmup or ``sampler`` not an
            ElasticSampler (a DistributedSampler cannot re-shard mid-epoch).
    """

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, *,
                 warmup: LinearScalingWarmup | None = None,
                 sampler: ElasticSampler | None = None, **extras: Any) -> None:
        if warmup is not None:
            require_instance("warmup", warmup, LinearScalingWarmup,
                             "an hvdtrain LinearScalingWarmup")
        if sampler is not None:
            require_instance("sampler", sampler, ElasticSampler,
                             "hvdtrain.adapters.torch.elastic.ElasticSampler (a "
                             "DistributedSampler cannot re-shard the rest of an epoch)")
            extras["sampler"] = sampler
        super().__init__(model, optimizer, **extras)
        abandon_step = getattr(optimizer, "_abandon_step", None)  # hvdtrain's optimizers'
        if abandon_step is not None:
            # A failed collective leaves its step half done: passes counted, handles open.
            self.register_reset_callbacks([abandon_step])
        if is_sharded(optimizer):
            # Horovod's handler broadcasts the state as it is, slices of the old number
            # of workers; this one keeps and re-shards the whole state.
            self._handlers["optimizer"] = _ShardedOptimizerHandler(
                optimizer, self._handlers["optimizer"]._saved_optimizer_state)
        if warmup is not None:
            # After Horovod's handlers, so that it syncs after the optimizer (whose
            # broadcast state carries rank 0's rates) and sets the rates last.
            self._handlers["warmup"] = _WarmupHandler(warmup)
            self.warmup = warmup


class _WarmupHandler:
    """Horovod's state-handler protocol (save, restore, sync, set_value) for a
    LinearScalingWarmup."""

    def __init__(self, warmup: LinearScalingWarmup) -> None:
        self.value = warmup
        self.save()

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self) -> None:
        self.value.load_state_dict(_hvd.broadcast_object(
            self.value.state_dict(), root_rank=0, name="hvdtrain.elastic.warmup"))
        self.value.set_world_size(_hvd.size())
        self.save()

    def set_value(self, value: LinearScalingWarmup) -> None:
        require_instance("warmup", value, LinearScalingWarmup,
                         "an hvdtrain LinearScalingWarmup")
        self.value = value
        self.save()


class _ShardedOptimizerHandler:
    """Horovod's state-handler protocol for a ``DistributedOptimizer(shard_state=True)``.

    A commit keeps the whole state, gathered from every worker's slice, in host memory:
    after a worker is lost its slice exists nowhere else. ``sync()`` (after every reset)
    gives every worker rank 0's committed state and re-shards it for the workers there
    are now (:meth:`.sharding.ShardedState.reshard`).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
        self.value = optimizer
        self._saved = _in_host_memory(saved)

    def save(self) -> None:
        self._saved = _in_host_memory(self.value.state_dict())  # every worker commits

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)  # local; sync() re-shards after the reset

    def sync(self) -> None:
        whole = broadcast_tree(self._saved if _hvd.rank() == 0 else None, 0,
                               "elastic.sharded_optimizer")
        self.value.reshard(whole)  # it copies what it keeps
        self._saved = whole  # rank 0's own saved copy, or the host tensors just received

    def set_value(self, value: torch.optim.Optimizer) -> None:
        if not is_sharded(value):
            raise TypeError("state.optimizer was a DistributedOptimizer(shard_state=True); "
                            "replace it with another one, or build a new TorchState")
        self.value = value
        self.save()


def _in_host_memory(state: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``state`` whose tensors live in host memory."""
    return map_leaves(state, lambda leaf: leaf.detach().to("cpu", copy=True)
                      if isinstance(leaf, torch.Tensor) else copy.deepcopy(leaf))

"""Sharded optimizer state for :func:`.optimizer.DistributedOptimizer`:
``shard_state=True`` (ZeRO stage 1) and ``shard_gradients=True`` (stage 2; Rajbhandari
et al. 2020).

Each param group's trainable parameters become views into one flat buffer
(:class:`hvdtrain.sharding.ShardLayout`), of which each worker owns one shard.
With ``shard_state``, ``synchronize()`` averages the gradients as the unsharded
optimizer does (one flat allreduce, so clipping and the non-finite check work
unchanged). With ``shard_gradients`` it reduce-scatters them instead, each worker
receiving the average of its own shard (``shard.grad``), and fills the parameters'
gradients with NaN, since they no longer hold the average. ``step()`` then steps this
worker's shard with the user's optimizer, whose ``state`` holds that shard's state
alone, and the stepped shards are shared back into every worker's buffer (an
all-gather, or in-place broadcasts for buffers above :data:`GATHER_MAX_BYTES`).

Stage 1 moves one and a half allreduces' worth of bytes per step, stage 2 one (a
reduce-scatter and the sharing). Horovod 0.28.1's reduce-scatter is fast only with
hvdtrain's patches ``0007-gloo-ring-reducescatter`` and ``0008-mpi-ring-reducescatter``
(benchmarks/README.md, benchmark 7).

:class:`ShardedState` is the subclass of :class:`.averaging.GradientAveraging` that
``shard_state=True`` picks; the reduce-scatter of ``shard_gradients`` is its subclass
:class:`.sharded_gradients.ShardedGradients`.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch
from horovod.common.exceptions import HorovodInternalError

from hvdtrain import allocator, watchdog
from hvdtrain.adapters.torch.averaging import GradientAveraging
from hvdtrain.collective import TensorCollective
from hvdtrain.sharding import ShardLayout

__all__ = ["ELEMENTWISE_OPTIMIZERS", "ParameterShard", "ShardedState", "explaining_join",
           "is_sharded", "require_elementwise"]

# Optimizers whose update of an element reads only that element's gradient and state,
# so that stepping a shard of the flattened parameters is stepping those elements.
ELEMENTWISE_OPTIMIZERS: tuple[type, ...] = (
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax,
    torch.optim.NAdam, torch.optim.RAdam, torch.optim.RMSprop, torch.optim.Adagrad,
    torch.optim.Adadelta, torch.optim.ASGD, torch.optim.Rprop,
)
# Up to this size a param group's parameters are shared back by one all-gather, whose
# result Horovod allocates anew each step: below glibc's mmap threshold (which
# hvdtrain.allocator raises to its largest) that memory is reused; above it every step
# would fault its pages in afresh, and in-place broadcasts are faster
# (benchmarks/README.md, benchmark 7).
GATHER_MAX_BYTES = allocator.MMAP_THRESHOLD_BYTES
# Per-parameter state entries that are one number for the whole tensor, not one per
# element (torch's optimizers keep a step count; NAdam and ASGD a few more).
SCALAR_STATE = frozenset({"step", "mu_product", "eta", "mu"})


def is_sharded(optimizer: torch.optim.Optimizer | None) -> bool:
    """Whether ``optimizer`` is a DistributedOptimizer with ``shard_state=True``."""
    return bool(getattr(optimizer, "shard_state", False))


def require_elementwise(optimizer: torch.optim.Optimizer) -> None:
    """Raise TypeError, naming the optimizer, unless its update is known to be elementwise."""
    if type(optimizer) in ELEMENTWISE_OPTIMIZERS:
        return
    known = ", ".join(cls.__name__ for cls in ELEMENTWISE_OPTIMIZERS)
    raise TypeError(
        f"shard_state=True cannot shard {type(optimizer).__module__}."
        f"{type(optimizer).__qualname__}: each worker steps its own shard of the flattened "
        "parameters, which is right only for an optimizer whose update of an element reads "
        "that element's gradient and state alone (one that needs the whole gradient, as "
        f"LBFGS does, or a norm or matrix inside its update, is not). Known to be "
        f"elementwise: torch.optim's {known}. Use one of them, or drop shard_state")


class ParameterShard:
    """One param group's trainable parameters as views into one flat buffer, of which
    this worker owns one shard: ``shard``, the parameter the user's optimizer steps (a
    view too, so a step of it is a step of those parameters' elements).

    Args:
        parameters: the group's parameters that require a gradient, all of one dtype
            and device; from here on each one's ``data`` is a view into ``buffer``.
        layout: how the buffer is split, seen from this worker.
    """

    def __init__(self, parameters: list[torch.Tensor], layout: ShardLayout) -> None:
        self.parameters = parameters
        self.layout = layout
        first = parameters[0]
        # Padded so that every worker's shard has one length, as the all-gather needs.
        self.buffer = torch.zeros(layout.padded_total, dtype=first.dtype, device=first.device)
        self._views = self.split(self.buffer)
        for parameter, view in zip(parameters, self._views, strict=True):
            view.copy_(parameter.detach())
            parameter.data = view
        self.shard = torch.nn.Parameter(self.buffer[layout.start:layout.end])

    def keep_linked(self, name_of: Callable[[torch.Tensor], str]) -> None:
        """Put back into the buffer, value kept, any parameter whose ``data`` was replaced
        (``p.data = ...``, ``load_state_dict(assign=True)``); refuse one whose shape,
        dtype or device changed, which the buffer cannot follow."""
        for parameter, view in zip(self.parameters, self._views, strict=True):
            if parameter.data_ptr() == view.data_ptr() and parameter.shape == view.shape:
                continue
            if (parameter.shape, parameter.dtype, parameter.device) != (
                    view.shape, view.dtype, view.device):
                raise RuntimeError(
                    f"parameter {name_of(parameter)!r} changed from "
                    f"{tuple(view.shape)} {view.dtype} on {view.device} to "
                    f"{tuple(parameter.shape)} {parameter.dtype} on {parameter.device} after "
                    "DistributedOptimizer(shard_state=True) was made, but its sharded buffer "
                    "cannot follow; move or convert the model before wrapping the optimizer")
            view.copy_(parameter.detach())
            parameter.data = view

    def gradient_shard(self) -> torch.Tensor:
        """This worker's shard of the parameters' gradients: a view when they lie end to
        end in one buffer (as hvdtrain's flat allreduce leaves them), else a copy (a
        missing gradient counts as zeros)."""
        gradients = [p.grad for p in self.parameters]
        whole = _end_to_end(gradients)
        if whole is not None:
            return whole[self.layout.start:self.layout.end]
        return self.shard_of(gradients)

    def split(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        """A whole buffer as one view per parameter, each shaped like it."""
        return [buffer[offset:offset + p.numel()].view_as(p)
                for p, offset in zip(self.parameters, self.layout.offsets(), strict=True)]

    def shard_of(self, values: list[torch.Tensor | None]) -> torch.Tensor:
        """This worker's shard of per-parameter ``values`` (each shaped like its
        parameter; None counts as zeros), as a new tensor like ``shard``."""
        part = torch.zeros_like(self.shard.data)
        for piece in self.layout.pieces():
            value = values[piece.tensor]
            if value is not None:
                value = value.to_dense() if value.is_sparse else value
                part[piece.shard_offset:piece.shard_offset + piece.length].copy_(
                    value.reshape(-1)[piece.tensor_offset:piece.tensor_offset + piece.length])
        return part

    def gather_shards(self, tensors: TensorCollective, name: str) -> Any:
        """Start the all-gather of every worker's (padded) shard of the buffer; its
        result is copied into the buffer by :meth:`take_gathered`."""
        length = self.layout.shard_length
        own = self.buffer[self.layout.rank * length:(self.layout.rank + 1) * length]
        return tensors.allgather(own, name)

    def take_gathered(self, gathered: torch.Tensor) -> None:
        """Copy the result of :meth:`gather_shards` into the buffer."""
        self.buffer.copy_(gathered)

    def broadcast_shards(self, tensors: TensorCollective, roots: list[int], name: str
                         ) -> list[Any]:
        """Start broadcasting each worker's shard of the buffer from it (``roots``: each
        worker's rank as Horovod's broadcast names it, a global rank), in place."""
        handles = []
        for index, root in enumerate(roots):
            start, end = self.layout.bounds(index)
            if start < end:
                handles.append(tensors.broadcast(self.buffer[start:end], root,
                                                 f"{name}.{index}"))
        return handles


@contextlib.contextmanager
def explaining_join() -> Iterator[None]:
    """Turn Horovod's refusal of a collective after another worker's ``join()`` into
    what to do about it."""
    try:
        yield
    except HorovodInternalError as error:
        if "with Join" not in str(error):
            raise
        raise RuntimeError(
            "a worker called join() while others still step, but with shard_state=True "
            "every worker steps its shard of the parameters each step; give every worker "
            "the same number of steps (hvt.distributed_sampler(dataset) pads the shares), "
            "or drop shard_state for uneven shares") from error


def _end_to_end(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The 1-D view over ``tensors`` when they are dense, contiguous and laid end to end
    in one storage, in order; otherwise None."""
    first = tensors[0]
    if any(t is None or t.is_sparse or not t.is_contiguous() for t in tensors):
        return None
    storage, position = first.untyped_storage().data_ptr(), first.data_ptr()
    for tensor in tensors:
        if tensor.untyped_storage().data_ptr() != storage or tensor.data_ptr() != position \
                or tensor.dtype != first.dtype:
            return None
        position += tensor.numel() * tensor.element_size()
    return first.as_strided((sum(t.numel() for t in tensors),), (1,))


class ShardedState(GradientAveraging):
    """The distributed optimizer with ``shard_state=True`` (ZeRO stage 1; see the
    module): the gradients averaged as by :class:`.averaging.GradientAveraging`, then
    each worker steps its shard and shares it."""

    @property
    def shard_state(self) -> bool:
        """Whether each worker keeps a shard of the optimizer state: here, yes."""
        return True

    def _build_state(self) -> None:
        """The shards, before the state is loaded into them."""
        self._build_shards()

    def _require_averaged_shards(self) -> None:
        """Nothing to check where every worker holds the whole averaged gradients (with
        ``shard_gradients``, :class:`.sharded_gradients.ShardedGradients` checks its shards)."""

    def _build_shards(self) -> None:
        """One :class:`ParameterShard` per param group (None for a group with nothing to
        train), split among the workers of the process set."""
        included = self.process_set.included()
        world = self.process_set.size() if included else 1
        rank = self.process_set.rank() if included else 0
        # shard_gradients: each gradient and its version after the reduce-scatter filled it.
        self._filled_gradients: dict[torch.Tensor, tuple[torch.Tensor, int]] = {}
        self._shards: list[ParameterShard | None] = []
        for index, group in enumerate(self.param_groups):
            parameters = [p for p in group["params"] if p.requires_grad]
            kinds = {(p.dtype, p.device) for p in parameters}
            if len(kinds) > 1:
                raise ValueError(
                    f"shard_state=True keeps each param group in one buffer, but group {index} "
                    f"mixes dtypes or devices ({sorted(map(str, kinds))}); put parameters of "
                    "each dtype and device in a param group of their own")
            self._shards.append(ParameterShard(parameters, ShardLayout(
                tuple(p.numel() for p in parameters), world, rank)) if parameters else None)

    def reshard(self, whole_state: dict[str, Any]) -> None:
        """Split the parameters and ``whole_state`` (an unsharded-format state, as
        :meth:`state_dict` makes) anew among the workers there are now: after an elastic
        reset. Local: every worker must pass the same state."""
        self._shards = None
        self._build_shards()
        self.load_state_dict(whole_state)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's, until the shards are built; afterwards refused (they would not follow)."""
        if getattr(self, "_shards", None) is not None:
            raise NotImplementedError(
                "add_param_group after DistributedOptimizer(shard_state=True) is made: the "
                "shards are fixed; give every param group to the optimizer before wrapping it")
        super().add_param_group(param_group)

    def _apply_averaged(self, closure=None):
        """Step this worker's shard of every param group with its shard of the state,
        then share each worker's shard into everyone's parameters."""
        if closure is not None:
            raise ValueError("step(closure) with shard_state=True: a closure recomputes the "
                             "gradients after they were averaged, and the step would not "
                             "see them; call backward() before step() instead")
        world = self.process_set.size() if self.process_set.included() else 1
        if any(shard is not None and shard.layout.world_size != world for shard in self._shards):
            raise RuntimeError(
                "the optimizer state is sharded for another number of workers than there "
                f"are now ({world}): an elastic reset happened without re-sharding it; keep "
                "the optimizer in hvdtrain.adapters.torch.elastic.TorchState, which does")
        sharded = self._holds_gradient_shards()
        if sharded:
            self._require_averaged_shards()
        groups = [group["params"] for group in self.param_groups]
        for group, shard in zip(self.param_groups, self._shards, strict=True):
            if shard is not None:
                shard.keep_linked(self.name_of)
                if not sharded:
                    shard.shard.grad = shard.gradient_shard()
            group["params"] = [shard.shard] if shard is not None and shard.shard.numel() else []
        try:
            result = super()._apply_averaged(closure)
        finally:
            for group, params, shard in zip(self.param_groups, groups, self._shards,
                                            strict=True):
                group["params"] = params
                if shard is not None:
                    shard.shard.grad = None
                    if sharded:  # they hold NaN; the next backward starts anew
                        for parameter in shard.parameters:
                            parameter.grad = None
            self._filled_gradients = {}
        if self.process_set.included():
            self._share_shards()
        return result

    def _share_shards(self) -> None:
        """Give every worker each worker's stepped shard of the parameters: one
        all-gather per param group when its buffer is small enough for the allocator to
        reuse the result's memory (:data:`GATHER_MAX_BYTES`), else one in-place
        broadcast per worker (no new memory). Horovod 0.28.1's all-gather breaks Horovod
        itself when a worker has called ``join()`` (its broadcast and reduce-scatter
        refuse cleanly), so it is used only when this step's reduction counted every
        worker, as the reduce-scatter of ``shard_gradients`` always has."""
        gather = self._holds_gradient_shards() or self._all_contributed
        gathers, broadcasts = [], []
        for index, shard in enumerate(self._shards):
            if shard is None:
                continue
            name = f"hvdtrain.shard_params.{index}"
            if gather and shard.buffer.numel() * shard.buffer.element_size() <= GATHER_MAX_BYTES:
                gathers.append((shard, shard.gather_shards(self._tensors, name)))
            else:
                roots = self.process_set.ranks or list(range(shard.layout.world_size))
                broadcasts.extend(shard.broadcast_shards(self._tensors, roots, name))
        with watchdog.guard(f"the parameter exchange of step {self.steps_taken - 1}"), \
                explaining_join():
            for shard, handle in gathers:
                shard.take_gathered(self._tensors.wait(handle))
            for handle in broadcasts:
                self._tensors.wait(handle)

    def state_dict(self) -> dict[str, Any]:
        """The whole optimizer state, gathered from every worker's shard, in the format
        of the unsharded optimizer (so either kind loads it). Every worker must call it:
        it is one all-gather per state tensor."""
        sharded_state, self.state = self.state, defaultdict(dict)
        try:
            whole = super().state_dict()  # the param groups, no state
        finally:
            self.state = sharded_state
        index = {p: i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        included = self.process_set.included()
        with watchdog.guard("the optimizer state all-gather (state_dict)"):
            for number, shard in enumerate(self._shards):
                if shard is None:
                    continue
                state = self.state.get(shard.shard, {})
                for key in sorted(state):
                    value = state[key]
                    if key in SCALAR_STATE or not torch.is_tensor(value) \
                            or value.shape != shard.shard.shape:
                        values = [value.clone() if torch.is_tensor(value) else value
                                  for _ in shard.parameters]
                    else:
                        gathered = self._tensors.wait(self._tensors.allgather(
                            value, f"hvdtrain.shard_state.{number}.{key}")) \
                            if included else value
                        values = [v.clone() for v in shard.split(gathered)]
                    for parameter, item in zip(shard.parameters, values, strict=True):
                        whole["state"].setdefault(index[parameter], {})[key] = item
        return whole

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take this worker's shard of a whole state (from :meth:`state_dict` or from the
        unsharded optimizer, written by any number of workers). Local: no communication."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups) or any(
                len(saved["params"]) != len(group["params"])
                for saved, group in zip(saved_groups, self.param_groups, strict=True)):
            raise ValueError("the loaded state has param groups of other sizes than this "
                             "optimizer's: it was saved from an optimizer over other parameters")
        states = state_dict["state"]
        self.state = defaultdict(dict)
        for group, saved, shard in zip(self.param_groups, saved_groups, self._shards,
                                       strict=True):
            group.update({key: value for key, value in saved.items() if key != "params"})
            if shard is None:
                continue
            index = dict(zip(group["params"], saved["params"], strict=True))
            per_parameter = [states.get(index[p], {}) for p in shard.parameters]
            keys = sorted({key for state in per_parameter for key in state})
            for key in keys:
                values = [state.get(key) for state in per_parameter]
                if key in SCALAR_STATE or not all(
                        v is None or (torch.is_tensor(v) and v.numel() == p.numel())
                        for v, p in zip(values, shard.parameters, strict=True)):
                    first = next(v for v in values if v is not None)
                    self.state[shard.shard][key] = first.clone() if torch.is_tensor(first) \
                        else first
                else:
                    self.state[shard.shard][key] = shard.shard_of(values)

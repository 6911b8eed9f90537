"""Sharded optimizer state for :func:`.optimizer.DistributedOptimizer`
(``shard_state=True``; ZeRO stage 1-2, Rajbhandari et al. 2020).

Each param group's parameters are one flat buffer split among the workers
(:class:`hvdtrain.sharding.ShardLayout`). ``synchronize()`` reduce-scatters the
gradients, so each worker receives the average of its slice only; ``step()`` steps the
slice with the user's optimizer, whose ``state`` then holds that slice's state alone,
and all-gathers the slices back into the parameters. The communication is an
allreduce's (a reduce-scatter and an all-gather); the optimizer state per worker is
1/N of the whole.

``ShardedSteps``' methods replace :class:`.averaging.CheckedAveraging`'s in the class
that :func:`.averaging.distributed_class` builds with ``sharded=True``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import horovod.torch as _hvd
import torch
from horovod.torch import Average, Sum

from hvdtrain import watchdog
from hvdtrain.adapters.torch._horovod import HorovodOptimizer, collective_for
from hvdtrain.collective import gather
from hvdtrain.nonfinite import NonFiniteGradientError, nonfinite_gradient_message
from hvdtrain.sharding import ShardLayout

__all__ = ["ELEMENTWISE_OPTIMIZERS", "ParameterShard", "ShardedSteps", "is_sharded",
           "require_elementwise"]

# Optimizers whose update of an element reads only that element's gradient and state,
# so that stepping a slice of the flattened parameters is stepping those elements.
ELEMENTWISE_OPTIMIZERS: tuple[type, ...] = (
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax,
    torch.optim.NAdam, torch.optim.RAdam, torch.optim.RMSprop, torch.optim.Adagrad,
    torch.optim.Adadelta, torch.optim.ASGD, torch.optim.Rprop,
)
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
        f"{type(optimizer).__qualname__}: each worker steps its own slice of the flattened "
        "parameters, which is right only for an optimizer whose update of an element reads "
        "that element's gradient and state alone (one that needs the whole gradient, as "
        f"LBFGS does, or a norm or matrix inside its update, is not). Known to be "
        f"elementwise: torch.optim's {known}. Use one of them, or drop shard_state")


class ParameterShard:
    """One param group's trainable parameters as one flat buffer, of which this worker
    owns one slice: ``shard``, the parameter the user's optimizer steps.

    Args:
        parameters: the group's parameters that require a gradient, all of one dtype
            and device.
        layout: how their buffer is split, seen from this worker.
    """

    def __init__(self, parameters: list[torch.Tensor], layout: ShardLayout) -> None:
        self.parameters = parameters
        self.layout = layout
        self.pieces = layout.pieces()
        first = parameters[0]
        self.shard = torch.nn.Parameter(
            torch.zeros(layout.shard_length, dtype=first.dtype, device=first.device))
        self._gradients: torch.Tensor | None = None  # kept: its padding stays zero

    def pull_parameters(self) -> None:
        """Copy this worker's slice of the parameters into ``shard``."""
        flat_views = [p.detach().reshape(-1) for p in self.parameters]
        for piece in self.pieces:
            self.shard.data[piece.shard_offset:piece.shard_offset + piece.length].copy_(
                flat_views[piece.tensor][piece.tensor_offset:piece.tensor_offset + piece.length])

    def gradient_buffer(self) -> torch.Tensor:
        """Every parameter's gradient (zeros for none) in one buffer, zero-padded to equal
        slices (the same buffer every step)."""
        if self._gradients is None:
            self._gradients = self.shard.new_zeros(self.layout.padded_length)
        buffer = self._gradients
        for parameter, offset in zip(self.parameters, self.layout.offsets(), strict=True):
            part = buffer[offset:offset + parameter.numel()]
            if parameter.grad is None:
                part.zero_()
            else:
                grad = parameter.grad.to_dense() if parameter.grad.is_sparse else parameter.grad
                part.copy_(grad.reshape(-1))
        return buffer

    def split(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        """A whole buffer (the slices of every worker, gathered) as one tensor per
        parameter, each shaped like it."""
        return [buffer[offset:offset + p.numel()].view_as(p)
                for p, offset in zip(self.parameters, self.layout.offsets(), strict=True)]

    def push_parameters(self, gathered: torch.Tensor) -> None:
        """Write the gathered slices of every worker into the parameters."""
        with torch.no_grad():
            for parameter, value in zip(self.parameters, self.split(gathered), strict=True):
                parameter.copy_(value)

    def slice_of(self, values: list[torch.Tensor | None]) -> torch.Tensor:
        """This worker's slice of per-parameter ``values`` (each shaped like its
        parameter; None counts as zeros), as a new tensor like ``shard``."""
        buffer = self.shard.new_zeros(self.layout.padded_length)
        for value, offset in zip(values, self.layout.offsets(), strict=True):
            if value is not None:
                buffer[offset:offset + value.numel()].copy_(value.reshape(-1))
        return buffer[self.layout.start:self.layout.end].clone()

    def parameter_at(self, shard_index: int) -> torch.Tensor | None:
        """The parameter an element of the slice belongs to; None in the padding."""
        found = self.layout.locate(shard_index)
        return None if found is None else self.parameters[found[0]]


class ShardedSteps:
    """The distributed optimizer's methods with ``shard_state=True`` (see the module)."""

    def _build_shards(self) -> None:
        """One :class:`ParameterShard` per param group (None for a group with nothing to
        train), split among the workers of the process set."""
        included = self.process_set.included()
        world = self.process_set.size() if included else 1
        rank = self.process_set.rank() if included else 0
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
        self._shard_norm = 0.0
        # (parameter, its gradient, that gradient's version) when synchronize() ended
        self._gradient_versions: list[tuple[torch.Tensor, torch.Tensor, int]] = []

    def _trained(self) -> list[torch.Tensor]:
        """Every parameter in a shard (all that require a gradient)."""
        return [p for shard in self._shards if shard is not None for p in shard.parameters]

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's, until the shards are built; afterwards refused (they would not follow)."""
        if getattr(self, "_shards", None) is not None:
            raise NotImplementedError(
                "add_param_group after DistributedOptimizer(shard_state=True) is made: the "
                "shards are fixed; give every param group to the optimizer before wrapping it")
        super(self.__class__, self).add_param_group(param_group)

    def synchronize(self) -> None:
        """Reduce-scatter the gradients: afterwards each worker holds the average of its
        slice (of the micro-batches' sum, or their mean with
        ``average_aggregated_gradients``), and the L2 norm of all of them is known."""
        passes = {self.backward_passes_per_step - left for left in self._allreduce_delay.values()}
        divide = self.average_aggregated_gradients and self.backward_passes_per_step > 1
        if divide and len(passes) > 1:
            raise RuntimeError(
                "with shard_state=True and average_aggregated_gradients every trainable "
                f"parameter must get a gradient in each of the {self.backward_passes_per_step} "
                f"backward passes of a step; these saw {sorted(passes)} passes. Use every "
                "parameter in every pass, or set requires_grad=False on those you do not train")
        self._reduce_scatter(1.0 / max(passes, default=1) if divide else 1.0)

    def _reduce_scatter(self, postscale: float) -> None:
        included = self.process_set.included()
        predivide = self.gradient_predivide_factor if self.op == Average else 1.0
        pending = []
        for index, shard in enumerate(self._shards):
            if shard is None:
                continue
            wire, context = self._compression.compress(shard.gradient_buffer())
            handle = _hvd.reducescatter_async(
                wire, name=f"hvdtrain.shard_gradients.{index}", op=self.op,
                process_set=self.process_set, prescale_factor=1.0 / predivide,
                postscale_factor=postscale * predivide) if included else None
            pending.append((shard, wire, context, handle))
        square_sum = 0.0  # of this worker's slices: each slice's norm, as torch's clip takes it
        with watchdog.guard(f"the gradient reduce-scatter of step {self.steps_taken}"):
            for shard, wire, context, handle in pending:
                reduced = _hvd.synchronize(handle) if handle is not None else wire * postscale
                shard.shard.grad = self._compression.decompress(reduced, context).to(
                    shard.shard.dtype)
                square_sum += float(torch.linalg.vector_norm(shard.shard.grad)) ** 2
            square_sum = torch.tensor(square_sum, dtype=torch.float64)
            if included:
                square_sum = _hvd.allreduce(square_sum, op=Sum, name="hvdtrain.shard_norm",
                                            process_set=self.process_set)
        self._shard_norm = math.sqrt(square_sum.item())  # NaN and infinity stay so
        self._gradient_versions = [(p, p.grad, p.grad._version) for p in self._trained()
                                   if p.grad is not None]
        for parameter in self._allreduce_delay:
            self._allreduce_delay[parameter] = self.backward_passes_per_step
        self._handles.clear()
        self._synchronized = True

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the averaged gradients by their global L2 norm, as
        ``torch.nn.utils.clip_grad_norm_`` does, over every worker's slice (the norm is
        the one ``synchronize()`` reduced: no communication here). Call it after
        ``synchronize()`` and before ``step()`` inside ``skip_synchronize()``.

        Returns:
            The norm before clipping.
        """
        self._require_synchronized_for("clip_grad_norm_")
        if norm_type != 2.0:
            raise ValueError(f"with shard_state=True clip_grad_norm_ takes the L2 norm "
                             f"(norm_type=2.0), got norm_type={norm_type!r}")
        total = self._shard_norm
        coefficient = max_norm / (total + 1e-6)
        if coefficient < 1.0:
            for shard in self._shards:
                if shard is not None and shard.shard.grad is not None:
                    shard.shard.grad.mul_(coefficient)
            self._shard_norm = total * coefficient
        return torch.tensor(total)

    def step(self, closure=None):
        """Synchronize (unless already done), check, step this worker's slice with its
        slice of the state, and all-gather the slices into the parameters."""
        if closure is not None:
            raise ValueError("step(closure) with shard_state=True: a closure recomputes the "
                             "gradients of the whole parameters, but the step uses the "
                             "averaged slices; call backward() before step() instead")
        if not self._synchronize_for_step():
            self._require_untouched_gradients()
        step, self.steps_taken = self.steps_taken, self.steps_taken + 1
        if self.check_nonfinite and not math.isfinite(self._shard_norm):
            if self.skip_nonfinite:  # the norm is the same on every rank: no vote
                self.skipped_steps += 1
                self._synchronized = False
                return None
            raise NonFiniteGradientError(
                nonfinite_gradient_message(step, self._first_nonfinite_parameter()))
        groups = [group["params"] for group in self.param_groups]
        for group, shard in zip(self.param_groups, self._shards, strict=True):
            if shard is not None:
                shard.pull_parameters()
            group["params"] = [shard.shard] if shard is not None else []
        try:
            with self.skip_synchronize():
                result = HorovodOptimizer.step(self, closure)
        finally:
            for group, params in zip(self.param_groups, groups, strict=True):
                group["params"] = params
        self._all_gather_parameters()
        return result

    def _all_gather_parameters(self) -> None:
        included = self.process_set.included()
        pending = []
        for index, shard in enumerate(self._shards):
            if shard is None:
                continue
            shard.shard.grad = None
            handle = _hvd.allgather_async(shard.shard.data, name=f"hvdtrain.shard_params.{index}",
                                          process_set=self.process_set) if included else None
            pending.append((shard, handle))
        with watchdog.guard(f"the parameter all-gather of step {self.steps_taken - 1}"):
            for shard, handle in pending:
                shard.push_parameters(_hvd.synchronize(handle) if handle is not None
                                      else shard.shard.data)

    def _require_untouched_gradients(self) -> None:
        """Raise if a gradient changed (in place or replaced) after ``synchronize()``: with sharded
        state the step uses the reduced slices, so the change would be lost (a norm over
        ``p.grad`` is this worker's own, unaveraged, gradient's)."""
        changed = [p for p, grad, version in self._gradient_versions
                   if p.grad is not grad or grad._version != version]
        if changed:
            name = self._parameter_names.get(changed[0], "<unnamed>")
            raise RuntimeError(
                f"the gradient of {name!r} changed after optimizer.synchronize(), but with "
                "shard_state=True step() applies the averaged slices synchronize() made, and "
                "p.grad holds this worker's own gradient: torch.nn.utils.clip_grad_norm_ "
                "there would clip by a partial norm. Clip with optimizer.clip_grad_norm_("
                "max_norm) between synchronize() and step()")

    def _first_nonfinite_parameter(self) -> str | None:
        """The name of the first parameter with a non-finite averaged gradient element, on
        any worker's slice (one object allgather; only when the norm is not finite)."""
        found = None
        for shard in self._shards:
            if shard is None or shard.shard.grad is None or found is not None:
                continue
            bad = (~torch.isfinite(shard.shard.grad)).nonzero()
            if len(bad):
                parameter = shard.parameter_at(int(bad[0]))
                found = self._parameter_names.get(parameter, "<unnamed>")
        if not self.process_set.included():
            return found
        names = gather(collective_for(self.process_set), found, "hvdtrain.nonfinite_shard")
        return next((name for name in names if name is not None), None)

    def state_dict(self) -> dict[str, Any]:
        """The whole optimizer state, gathered from every worker's slice, in the format
        of the unsharded optimizer (so either kind loads it). Every worker must call it:
        it is one all-gather per state tensor."""
        sharded_state, self.state = self.state, defaultdict(dict)
        try:
            whole = torch.optim.Optimizer.state_dict(self)  # the param groups, no state
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
                        gathered = _hvd.allgather(value, name=f"hvdtrain.shard_state.{number}."
                                                  f"{key}", process_set=self.process_set) \
                            if included else value
                        values = [v.clone() for v in shard.split(gathered)]
                    for parameter, item in zip(shard.parameters, values, strict=True):
                        whole["state"].setdefault(index[parameter], {})[key] = item
        return whole

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take this worker's slice of a whole state (from :meth:`state_dict` or from the
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
                    self.state[shard.shard][key] = shard.slice_of(values)

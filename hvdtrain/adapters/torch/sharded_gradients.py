"""ZeRO stage 2 for :func:`.optimizer.DistributedOptimizer` (``shard_gradients=True``):
the gradients reduce-scattered, so that each worker receives the average of its own
shard of every param group (:class:`.sharding.ParameterShard`) and nothing else.

``synchronize()`` lays the gradients out as the workers' shards, each with the tally
of the flat allreduce behind it (:func:`.tally.rows_with_tally`), reduce-scatters them,
and fills the parameters' gradients with NaN, since they no longer hold the average.
``step()`` then refuses gradients changed since (torch's ``clip_grad_norm_``,
``GradScaler.unscale_``); clipping and the non-finite check work on the shards.
Stage 1, stepping the shards and sharing them back, is :mod:`.sharding`'s.

:class:`ShardedGradients` is the subclass of :class:`.sharding.ShardedState` that
``shard_gradients=True`` picks. A worker outside the process set keeps its own whole
gradients, and the classes it builds on handle it.
"""

from __future__ import annotations

import math

import horovod.torch as _hvd
import torch

from hvdtrain import watchdog
from hvdtrain.adapters.torch._horovod import allreduce_number
from hvdtrain.adapters.torch.sharding import ShardedState, explaining_join
from hvdtrain.adapters.torch.tally import rows_with_tally, split_tally

__all__ = ["ShardedGradients"]


class ShardedGradients(ShardedState):
    """The distributed optimizer with ``shard_gradients=True`` (ZeRO stage 2; see the
    module)."""

    @property
    def shard_gradients(self) -> bool:
        """Whether each worker reduces only its shard of the gradients: here, yes."""
        return True

    def _holds_gradient_shards(self) -> bool:
        """Whether this worker's averaged gradients are its shards alone: when it is in
        the process set."""
        return self.process_set.included()

    def _reduce_gradients(self, postscale: float, passes: dict[torch.Tensor, int] | None,
                          uniform: bool) -> None:
        """The reduce-scatter instead of the allreduce (arguments as
        :meth:`.averaging.GradientAveraging._reduce_gradients`')."""
        self._reduce_scatter_gradients(postscale, None if uniform else passes)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the averaged gradients by their global norm: every worker's shard by the
        norm over all of them (one scalar allreduce; every worker must call it), as
        ``torch.nn.utils.clip_grad_norm_`` clips whole gradients. Call it after
        ``synchronize()`` and before ``step()`` inside ``skip_synchronize()``.

        Returns:
            The norm before clipping.
        """
        if not self._holds_gradient_shards():
            return super().clip_grad_norm_(max_norm, norm_type)
        self._require_synchronized_for("clip_grad_norm_")
        return self._clip_shards(max_norm, norm_type)

    def _first_nonfinite_gradient(self) -> str | None:
        """The name of the first parameter whose averaged gradient is not finite in any
        worker's shard."""
        if not self._holds_gradient_shards():
            return super()._first_nonfinite_gradient()
        return self._first_nonfinite_in_shards()

    def _reduce_scatter_gradients(self, postscale: float, passes: dict | None) -> None:
        """``shard_gradients``: reduce-scatter each param group's gradients (and the
        tally, :func:`.tally.rows_with_tally`), so that this worker holds the average of
        its shard alone, as ``shard.grad``; the gradients themselves are then filled
        with NaN, so that nothing reads them as averaged. ``passes``: the backward
        passes of each gradient, to divide by here when they differ (else None)."""
        if passes is not None:
            for parameter, count in passes.items():
                if count > 1 and parameter.grad is not None:
                    parameter.grad.div_(count)
        predivide = self.gradient_predivide_factor if self.op == _hvd.Average else 1.0
        pending = []
        for index, shard in enumerate(self._shards):
            if shard is None:
                continue
            for parameter in shard.parameters:
                if parameter.grad is None:  # another rank may have computed it
                    parameter.grad = torch.zeros_like(parameter)
                elif parameter.grad.is_sparse:
                    raise ValueError(
                        f"the gradient of {self.name_of(parameter)!r} "
                        "is sparse, but shard_gradients=True reduce-scatters dense gradients; "
                        "make the layer dense (nn.Embedding(sparse=False)) or drop "
                        "shard_gradients")
            rows = rows_with_tally([p.grad for p in shard.parameters], shard.layout,
                                   bound=self.on_nonfinite.checks)
            wire, context = self._compression.compress(rows)
            handle = self._tensors.reduce_scatter(
                wire, f"hvdtrain.gradient_shards.{index}", op=self._reduce_op,
                prescale=1.0 / predivide, postscale=postscale * predivide)
            pending.append((shard, context, handle))
            for parameter in shard.parameters:
                parameter.grad.fill_(float("nan"))
        unit = postscale / (self.process_set.size() if self.op == _hvd.Average else 1)
        with watchdog.guard(f"the gradient reduce-scatter of step {self.steps_taken}"), \
                explaining_join():
            for shard, context, handle in pending:
                row = self._compression.decompress(self._tensors.wait(handle), context)
                gradients, contributors, finite = split_tally(
                    row.reshape(-1), unit, prescale=1.0 / predivide,
                    largest=self._wire_largest(row.dtype))
                self._rescale_after_join(gradients, contributors)
                shard.shard.grad = gradients[:shard.layout.end - shard.layout.start]
                self._flat_gradients.append((shard.shard.grad, [shard.shard], finite))
        self._filled_gradients = {parameter: (parameter.grad, parameter.grad._version)
                                  for shard in self._shards if shard is not None
                                  for parameter in shard.parameters}
        self._finish_synchronize()

    def _require_averaged_shards(self) -> None:
        """``shard_gradients``: raise unless this step's gradients were reduce-scattered
        and none changed since, as torch's ``clip_grad_norm_`` or
        ``GradScaler.unscale_`` would change them: each worker holds only its shard of
        the averaged gradients, so those would act on a part of them, or on none."""
        if not self._filled_gradients:
            raise RuntimeError("step() inside skip_synchronize() without synchronize() first: "
                               "with shard_gradients=True the step needs this worker's shard "
                               "of the averaged gradients; call optimizer.synchronize() first")
        for parameter, (gradient, version) in self._filled_gradients.items():
            if parameter.grad is not gradient or gradient._version != version:
                raise RuntimeError(
                    f"the gradient of {self.name_of(parameter)!r} "
                    "changed after synchronize(), but with shard_gradients=True each worker "
                    "holds only its shard of the averaged gradients (p.grad holds NaN), so "
                    "whatever changed it (torch.nn.utils.clip_grad_norm_, "
                    "GradScaler.unscale_, ...) did not act on the averaged gradients; clip "
                    "with optimizer.clip_grad_norm_(max_norm), which takes the norm over "
                    "every worker's shard, or drop shard_gradients")

    def _first_nonfinite_in_shards(self) -> str | None:
        """``shard_gradients``: the name of the first parameter, in the order of the param
        groups, with a NaN or Inf in any worker's shard of its averaged gradient (one
        scalar allreduce, so every worker names the same one). Only on a worker in the
        process set."""
        first = math.inf
        position = 0
        for shard in self._shards:
            if shard is None:
                continue
            gradient = shard.shard.grad
            if gradient is not None and not bool(torch.isfinite(gradient).all()):
                for piece in shard.layout.pieces():
                    values = gradient[piece.shard_offset:piece.shard_offset + piece.length]
                    if not bool(torch.isfinite(values).all()):
                        first = min(first, position + piece.tensor)
                        break
            position += len(shard.parameters)
        found = allreduce_number(first, "min", "hvdtrain.nonfinite_shards", self.process_set,
                                 "the non-finite gradient vote (hvdtrain.nonfinite_shards)")
        if not math.isfinite(found):
            return None
        parameters = [p for shard in self._shards if shard is not None for p in shard.parameters]
        return self.name_of(parameters[int(found)])

    def _clip_shards(self, max_norm: float, norm_type: float) -> torch.Tensor:
        """``shard_gradients``: clip every worker's shard of the averaged gradients by
        their norm over all the shards (one scalar allreduce), as
        ``torch.nn.utils.clip_grad_norm_`` clips whole gradients. Returns that norm. Only
        on a worker in the process set."""
        shards = [shard.shard for shard in self._shards
                  if shard is not None and shard.shard.grad is not None]
        local = torch.nn.utils.get_total_norm([p.grad for p in shards], norm_type)
        local = local.to(torch.float64).reshape(1)
        infinite = math.isinf(norm_type)
        with watchdog.guard("the gradient norm allreduce (clip_grad_norm_)"):
            total = self._tensors.wait(self._tensors.allreduce(
                local if infinite else local.pow(norm_type), "hvdtrain.gradient_norm",
                op="max" if infinite else "sum"))
        norm = total[0] if infinite else total[0].pow(1.0 / norm_type)
        if shards:
            norm = norm.to(shards[0].grad.dtype)
            torch.nn.utils.clip_grads_with_norm_(shards, max_norm, norm)
        return norm

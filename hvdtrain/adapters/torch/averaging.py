"""How the distributed optimizer averages and checks gradients:
:class:`GradientAveraging`, the class above :class:`.hooks.BackwardHooks`. Two paths:
one flat allreduce per dtype after ``backward()`` (with :mod:`.tally`'s count and bound
behind the gradients), or the per-tensor allreduces of :mod:`.hooks` (``overlap``). On
both, the average is taken over the ranks still training after a ``join()``, and the
result is checked for NaN and Inf and watched while it is awaited.

The ZeRO stages are its subclasses: :class:`.sharding.ShardedState` and
:class:`.sharded_gradients.ShardedGradients` override its steps (``_build_state``,
``_reduce_gradients``, ``_apply_averaged``, ...)."""

from __future__ import annotations

from typing import Any

import torch
from horovod.torch import Average, ProcessSet

from hvdtrain import watchdog
from hvdtrain.adapters.torch._horovod import observers_for
from hvdtrain.adapters.torch.compression import bf16_allreduce_async
from hvdtrain.adapters.torch.hooks import BackwardHooks
from hvdtrain.adapters.torch.tally import flat_with_tally, split_tally
from hvdtrain.collective import any_rank
from hvdtrain.compression import wire_format
from hvdtrain.nonfinite import NonFiniteGradientError, NonFinitePolicy, nonfinite_gradient_message
from hvdtrain.tally import joined_rescale, some_ranks_joined

__all__ = ["GradientAveraging"]


class GradientAveraging(BackwardHooks):
    """Worker-averaged gradients (of the micro-batches' sum, or of their mean when
    asked), checked for NaN/Inf and watched while they are awaited, and averaged over
    the ranks still training after a ``join()``. Arguments as
    :func:`.optimizer.DistributedOptimizer`'s."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 named_parameters: list[tuple[str, torch.Tensor]], *,
                 compression: str | None, backward_passes_per_step: int,
                 average_aggregated_gradients: bool, op,
                 groups: int | list[list[torch.Tensor]] | None,
                 skip_nonfinite: bool, check_nonfinite: bool, overlap: bool,
                 gradient_predivide_factor: float, sparse_as_dense: bool,
                 process_set: ProcessSet) -> None:
        super().__init__(optimizer, named_parameters, compression=compression,
                         backward_passes_per_step=backward_passes_per_step, op=op,
                         groups=groups, overlap=overlap,
                         gradient_predivide_factor=gradient_predivide_factor,
                         sparse_as_dense=sparse_as_dense, process_set=process_set)
        self.on_nonfinite = NonFinitePolicy.of(skip_nonfinite, check_nonfinite)
        self.average_aggregated_gradients = average_aggregated_gradients
        self.skipped_steps = 0
        self.steps_taken = 0
        self._wire = wire_format(compression)
        self._reduce_op = "average" if op == Average else "sum"
        self._flat_gradients: list[tuple[torch.Tensor, list[torch.Tensor], bool]] = []
        self._contributors: Any = None  # this step's count of ranks, per-tensor path
        self._all_contributed = False  # whether every rank sent this step's gradients
        self._build_state()
        self.load_state_dict(optimizer.state_dict())  # keep state built before wrapping

    @property
    def shard_state(self) -> bool:
        """Whether each worker keeps a shard of the optimizer state (ZeRO stage 1)."""
        return False

    @property
    def shard_gradients(self) -> bool:
        """Whether each worker reduces only its shard of the gradients (ZeRO stage 2)."""
        return False

    def _build_state(self) -> None:
        """What a subclass builds before the state is loaded (the shards of
        :class:`.sharding.ShardedState`); nothing here."""

    def synchronize(self) -> None:
        """Finish the allreduce of every gradient; afterwards each holds the mean over
        all workers of the sum of its micro-batches (with ``backward_passes_per_step``
        > 1), or of their mean with ``average_aggregated_gradients``."""
        if not self.process_set.included():  # nothing to average with (Horovod's meaning)
            self._synchronized = True
            return
        passes = {p: self.backward_passes_per_step - left
                  for p, left in self._passes_left.items()}
        self._flat_gradients = []
        self._all_contributed = False
        divide = self.average_aggregated_gradients and self.backward_passes_per_step > 1
        counts = set(passes.values()) if divide else {1}
        # When every gradient saw the same number of passes (the usual case), Horovod's
        # post-scaling divides by it, in the pass that divides by the world size.
        uniform = len(counts) == 1
        postscale = 1.0 / max(next(iter(counts)), 1) if uniform else 1.0
        observers = observers_for(self.process_set)
        if observers:
            observers.reduction_started(self.steps_taken)
        self._reduce_gradients(postscale, passes if divide else None, uniform)
        if observers:
            observers.reduction_finished(self.steps_taken)

    def _reduce_gradients(self, postscale: float, passes: dict[torch.Tensor, int] | None,
                          uniform: bool) -> None:
        """Average the gradients over the workers: the flat allreduce, or the per-tensor
        allreduces of :class:`.hooks.BackwardHooks`. ``postscale``: the factor the
        reduction applies (1 over the passes when ``uniform``, every gradient having
        seen as many); ``passes``: each gradient's backward passes, to divide by where
        the reduction did not (None: no division)."""
        if self._sends_flat():
            self._allreduce_flat(postscale)
            if uniform:
                return
        else:
            with watchdog.guard(self._pending_allreduces):
                try:  # the synchronize may start the count (gradients no hook sent)
                    self._synchronize_per_tensor()
                finally:  # a step that failed leaves no count behind for the next one
                    contributors, self._contributors = self._contributors, None
                self._average_over_contributors(contributors)
        if passes is not None:
            for parameter, count in passes.items():
                if count > 1 and parameter.grad is not None:
                    parameter.grad.div_(count)

    def step(self, closure=None):
        """Synchronize (unless already done), then apply the averaged gradients.

        With ``skip_nonfinite=True``, a step whose averaged gradient has a NaN or Inf
        on any rank is skipped on every rank and counted in ``skipped_steps``.
        """
        synchronizes_here = self._synchronize_for_step()
        step, self.steps_taken = self.steps_taken, self.steps_taken + 1
        # The bound describes the gradients as reduced, so it is trusted only when the
        # reduction ran inside this step (after the user's own synchronize() they may have
        # been changed in place). It is the same number on every rank: no vote needed.
        proved = synchronizes_here and self._bound_proves_finite()
        nonfinite = (self._first_nonfinite_gradient()
                     if self.on_nonfinite.checks and not proved else None)
        skip = self.on_nonfinite.skips and not proved and self._any_rank(nonfinite is not None)
        if nonfinite is not None and not skip:
            raise NonFiniteGradientError(nonfinite_gradient_message(step, nonfinite))
        result = None if skip else self._apply_averaged(closure)
        if skip:
            self.skipped_steps += 1
            self._synchronized = False
        observers = observers_for(self.process_set)
        if observers:
            observers.step_finished(step, applied=not skip)
        return result

    def _apply_averaged(self, closure=None):
        """The step itself, once the gradients are averaged and checked: the user's
        optimizer's (with ``shard_state=True``, :meth:`.sharding.ShardedState._apply_averaged`)."""
        self._synchronized = False
        return super().step(closure)

    def _abandon_step(self) -> None:
        """Forget the step a failed collective interrupted (after an elastic reset): the
        backward passes it counted, the allreduces it started, its synchronize()."""
        self._forget_started()
        self._contributors = None
        self._synchronized = False

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the averaged gradients by their global norm
        (``torch.nn.utils.clip_grad_norm_`` over this optimizer's parameters). Call it
        after ``synchronize()`` and before ``step()`` inside ``skip_synchronize()``
        (``torch.nn.utils.clip_grad_norm_`` on the parameters there does the same).

        Returns:
            The norm before clipping.
        """
        self._require_synchronized_for("clip_grad_norm_")
        return torch.nn.utils.clip_grad_norm_(
            [p for group in self.param_groups for p in group["params"] if p.grad is not None],
            max_norm, norm_type)

    def _holds_gradient_shards(self) -> bool:
        """Whether this worker's averaged gradients are its shards alone
        (:class:`.sharded_gradients.ShardedGradients`); not here."""
        return False

    def _require_synchronized_for(self, what: str) -> None:
        if not self._synchronized:
            raise RuntimeError(f"{what} works on the averaged gradients: call "
                               "optimizer.synchronize() first, then step() inside "
                               "`with optimizer.skip_synchronize():`")

    def _sends_flat(self) -> bool:
        """Whether this step's gradients go in one flat allreduce per dtype (no overlap, a
        group of workers, dense gradients, a format Horovod reduces) rather than through
        Horovod's per-tensor synchronize."""
        return (not self.overlap and self._wire.reduced_natively and bool(self._trained)
                and not any(p.grad is not None and p.grad.is_sparse for p in self._trained))

    def _allreduce_flat(self, postscale: float) -> None:
        """Average the gradients in one allreduce per dtype and device, each on one
        contiguous copy of them, in place (so Horovod copies nothing in or out of its
        fusion buffer); afterwards every gradient is a view into its copy, and the
        non-finite check reads the copies (:meth:`_first_nonfinite_gradient`)."""
        by_kind: dict[tuple, list[torch.Tensor]] = {}
        for parameter in self._trained:
            if parameter.grad is None:  # another rank may have computed it
                parameter.grad = torch.zeros_like(parameter)
            by_kind.setdefault((parameter.dtype, parameter.device), []).append(parameter)
        # Horovod's own split of an average (see its _allreduce_grad_async).
        predivide = self.gradient_predivide_factor if self.op == Average else 1.0
        pending = []
        for (dtype, device), parameters in by_kind.items():
            flat = self._flat_with_tally([p.grad for p in parameters], dtype, device)
            wire, context = self._compression.compress(flat)
            handle = self._tensors.allreduce(wire, f"hvdtrain.gradients.{dtype}",
                                             op=self._reduce_op, prescale=1.0 / predivide,
                                             postscale=postscale * predivide)
            pending.append((parameters, flat, context, handle))
        # What one contributed 1 (and each gradient element g) became after the reduction.
        unit = postscale / (self.process_set.size() if self.op == Average else 1)
        with watchdog.guard(lambda: self._describe_allreduce(
                [p for parameters, *_ in pending for p in parameters])):
            for parameters, flat, context, handle in pending:
                averaged = self._compression.decompress(self._tensors.wait(handle), context)
                if averaged is not flat:
                    flat.copy_(averaged)
                gradients, contributors, finite = split_tally(
                    flat, unit, prescale=1.0 / predivide, largest=self._wire_largest(dtype))
                self._rescale_after_join(gradients, contributors)
                offset = 0
                for parameter in parameters:
                    size = parameter.numel()
                    parameter.grad = gradients[offset:offset + size].view_as(parameter)
                    offset += size
                self._flat_gradients.append((gradients, parameters, finite))
        self._finish_synchronize()

    def _flat_with_tally(self, gradients: list[torch.Tensor], dtype: torch.dtype,
                         device: torch.device) -> torch.Tensor:
        """One buffer of ``gradients`` and their tally (:func:`.tally.flat_with_tally`),
        with the bound only when the check is on."""
        return flat_with_tally(gradients, dtype, device, bound=self.on_nonfinite.checks)

    def _wire_largest(self, dtype: torch.dtype) -> float:
        """The largest finite number the gradients of ``dtype`` take on the wire (the
        limit of the bound's proof: :func:`hvdtrain.tally.finite_bound_limit`)."""
        return self._wire.largest_for(torch.finfo(dtype).max)

    def _pending_allreduces(self) -> str:
        return self._describe_allreduce([p for key in list(self._started)
                                         for p in (key if isinstance(key, tuple) else (key,))])

    def _describe_allreduce(self, parameters: list[torch.Tensor]) -> str:
        """What the watchdog reports when the allreduce of ``parameters`` hangs."""
        names = [f"allreduce.{self.name_of(p)}" for p in parameters]
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        return f"the gradient allreduce of step {self.steps_taken} ({shown})"

    def _first_nonfinite_gradient(self) -> str | None:
        """The name of the first parameter whose (averaged) gradient is not finite."""
        parameters = [p for group in self.param_groups for p in group["params"]
                      if p.grad is not None]
        if not parameters:
            return None
        # A NaN or Inf anywhere makes the sum non-finite: one read of each gradient (of
        # the flat copies, when the gradients are still views into them) and one device
        # synchronisation in the common case. Only a sum that overflows without any
        # non-finite element needs the exact look below.
        buffers = self._flat_buffers() or [p.grad for p in parameters]
        total = buffers[0].sum()
        for buffer in buffers[1:]:
            total = total + buffer.sum()
        if bool(total.isfinite()):
            return None
        for parameter in parameters:
            if not bool(torch.isfinite(parameter.grad).all()):
                return self.name_of(parameter)
        return None

    def _bound_proves_finite(self) -> bool:
        """Whether the bounds reduced with the last flat allreduce prove every averaged
        gradient finite (see :mod:`.tally`)."""
        return bool(self._flat_gradients) and all(
            finite for *_, finite in self._flat_gradients)

    def _flat_buffers(self) -> list[torch.Tensor]:
        """The flat gradients of the last synchronize, if every gradient is still a view
        into one of them (nothing replaced a gradient since); otherwise none."""
        buffers = []
        for flat, parameters, _ in self._flat_gradients:
            start, end = flat.data_ptr(), flat.data_ptr() + flat.numel() * flat.element_size()
            if not all(p.grad is not None and start <= p.grad.data_ptr() < end
                       for p in parameters):
                return []
            buffers.append(flat)
        return buffers

    def _allreduce_grad_async(self, parameter: torch.Tensor) -> tuple[Any, Any]:
        """The per-tensor allreduce, counting the contributors with the first; bf16
        through the allgather on a Horovod without the bfloat16 patch."""
        if self._wire.reduced_natively or parameter.grad is None or parameter.grad.is_sparse:
            self._count_contributors()
            return super()._allreduce_grad_async(parameter)
        return bf16_allreduce_async(parameter.grad, self.name_of(parameter),
                                    self._reduce_op, self._tensors), None

    def _grouped_allreduce_grad_async(self, group: tuple[torch.Tensor, ...]
                                      ) -> tuple[Any, Any]:
        """The grouped allreduce, counting the contributors with the first."""
        self._count_contributors()
        return super()._grouped_allreduce_grad_async(group)

    def _count_contributors(self) -> None:
        """With the step's first per-tensor allreduce, start one of this rank's 1 (a
        rank that called ``join()`` adds 0): its sum is the number of ranks that sent
        gradients. Started early, it travels in the same cycle as the first gradients."""
        if self._contributors is None and self.op == Average:
            self._contributors = self._tensors.allreduce(torch.ones(1), "hvdtrain.contributors")

    def _average_over_contributors(self, handle: Any) -> None:
        """After Horovod's per-tensor averages, which divide by every rank: rescale the
        dense gradients to the average over the ranks that sent them, as the flat path
        does. ``handle``: this step's count (:meth:`_count_contributors`), or None."""
        if handle is None:
            return
        dense = [p.grad for p in self._trained if p.grad is not None and not p.grad.is_sparse]
        self._rescale_after_join(dense, round(self._tensors.wait(handle).item()))

    def _rescale_after_join(self, gradients: torch.Tensor | list[torch.Tensor],
                            contributors: int) -> None:
        """Turn ``gradients``, averaged over every rank, into their average over the
        ``contributors`` (:func:`hvdtrain.tally.joined_rescale`), in place, when
        some ranks had joined; remember whether all contributed."""
        size = self.process_set.size()
        self._all_contributed = not some_ranks_joined(contributors, size)
        if self.op != Average or self._all_contributed or contributors == 0:
            return
        factor = joined_rescale(contributors, size)
        for gradient in gradients if isinstance(gradients, list) else [gradients]:
            gradient.mul_(factor)

    def _any_rank(self, condition: bool) -> bool:
        """True on every rank of the process set when ``condition`` holds on at least
        one (:func:`hvdtrain.collective.any_rank`); a rank outside the set decides
        alone."""
        if not self.process_set.included():
            return condition
        flag = torch.tensor([1.0 if condition else 0.0], dtype=torch.float64)
        with watchdog.guard("the non-finite gradient vote (hvdtrain.any_rank)"):
            return bool(any_rank(flag, self._tensors, "hvdtrain.any_rank"))

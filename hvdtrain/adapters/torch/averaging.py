"""How :func:`.optimizer.DistributedOptimizer` averages and checks gradients:
``CheckedAveraging``'s methods, set beside Horovod's optimizer methods on a subclass of
the user's optimizer class (:func:`.layers.distributed_class`). Two paths: one flat
allreduce per dtype after ``backward()`` (with :mod:`.tally`'s count and bound behind
the gradients), or Horovod's per-tensor allreduces during it (``overlap``).

It is the lowest of the optimizer's layers: :class:`.sharding.ShardedSteps` and
:class:`.gradient_slices.SlicedGradients` build on it by overriding its hooks
(``_build_layers``, ``_reduce_gradients``, ``_holds_gradient_slices``, ...), and it
calls no method of theirs."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from horovod.torch import Average, ProcessSet

from hvdtrain import watchdog

# Horovod's optimizer class: its methods add the gradient hooks, fusion and
# synchronize(); distributed_class builds on them.
from hvdtrain.adapters.torch._horovod import HorovodOptimizer as _HorovodOptimizer
from hvdtrain.adapters.torch._horovod import observers_for, tensors
from hvdtrain.adapters.torch.compression import bf16_allreduce_async, horovod_compression
from hvdtrain.adapters.torch.tally import flat_with_tally, read_tally
from hvdtrain.gradients import (
    NonFinitePolicy,
    any_rank,
    joined_rescale,
    some_ranks_joined,
    wire_format,
)
from hvdtrain.nonfinite import NonFiniteGradientError, nonfinite_gradient_message

__all__ = ["CheckedAveraging"]


class CheckedAveraging:
    """hvdtrain's layer over Horovod's distributed optimizer: worker-averaged gradients
    (of the micro-batches' sum, or of their mean when asked), checked for NaN/Inf and
    watched while they are awaited, and averaged over the ranks still training after
    a ``join()``.

    Horovod's methods call ``super(self.__class__, self)``, so its optimizer cannot be
    subclassed; instead these methods sit beside Horovod's in one class whose base is
    the user's optimizer class (:func:`.layers.distributed_class`), and call Horovod's
    explicitly, as the layers above call these.
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 named_parameters: list[tuple[str, torch.Tensor]], *,
                 compression: str | None, backward_passes_per_step: int,
                 average_aggregated_gradients: bool, op,
                 groups: int | list[list[torch.Tensor]] | None,
                 skip_nonfinite: bool, check_nonfinite: bool, overlap: bool,
                 gradient_predivide_factor: float, sparse_as_dense: bool,
                 process_set: ProcessSet, shard_state: bool = False,
                 shard_gradients: bool = False) -> None:
        self.overlap = overlap  # read by _make_hook, which Horovod's __init__ calls
        _HorovodOptimizer.__init__(self, optimizer.param_groups, named_parameters,
                                   horovod_compression(compression), backward_passes_per_step,
                                   op, gradient_predivide_factor, groups, sparse_as_dense,
                                   process_set)
        self.defaults = optimizer.defaults  # Horovod rebuilds with the class's defaults
        self.on_nonfinite = NonFinitePolicy.of(skip_nonfinite, check_nonfinite)
        self.average_aggregated_gradients = average_aggregated_gradients
        self.skipped_steps = 0
        self.steps_taken = 0
        self._wire = wire_format(compression)
        self._tensors = tensors(self.process_set)
        self._reduce_op = "average" if op == Average else "sum"
        self._flat_gradients: list[tuple[torch.Tensor, list[torch.Tensor], bool]] = []
        self._contributors: Any = None  # this step's count of ranks, per-tensor path
        self._all_contributed = False  # whether every rank sent this step's gradients
        self.shard_state = shard_state or shard_gradients
        self.shard_gradients = shard_gradients
        self._build_layers()
        self.load_state_dict(optimizer.state_dict())  # keep state built before wrapping

    def _build_layers(self) -> None:
        """What the layers above build before the state is loaded (the shards of
        :class:`.sharding.ShardedSteps`); nothing here."""

    def synchronize(self) -> None:
        """Finish the allreduce of every gradient; afterwards each holds the mean over
        all workers of the sum of its micro-batches (with ``backward_passes_per_step``
        > 1), or of their mean with ``average_aggregated_gradients``."""
        # Horovod counts down backward passes per parameter; read them before it resets.
        if not self.process_set.included():  # nothing to average with (Horovod's meaning)
            self._synchronized = True
            return
        passes = {p: self.backward_passes_per_step - left
                  for p, left in self._allreduce_delay.items()}
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
        """Average the gradients over the workers: the flat allreduce, or Horovod's
        per-tensor synchronize. ``postscale``: the factor the reduction applies (1 over
        the passes when ``uniform``, every gradient having seen as many); ``passes``:
        each gradient's backward passes, to divide by where the reduction did not (None:
        no division)."""
        if self._sends_flat():
            self._allreduce_flat(postscale)
            if uniform:
                return
        else:
            with watchdog.guard(self._pending_allreduces):
                try:  # Horovod's synchronize may start the count (gradients no hook sent)
                    _HorovodOptimizer.synchronize(self)
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
        skip = self.on_nonfinite.skips and not proved and self._on_any_rank(nonfinite is not None)
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
        """The step itself, once the gradients are averaged and checked (with
        ``shard_state=True``, :meth:`.sharding.ShardedSteps._apply_averaged`)."""
        with self.skip_synchronize():
            return _HorovodOptimizer.step(self, closure)

    def _abandon_step(self) -> None:
        """Forget the step a failed collective interrupted (after an elastic reset): the
        backward passes it counted, the allreduces it started, its synchronize()."""
        for parameter in self._allreduce_delay:
            self._allreduce_delay[parameter] = self.backward_passes_per_step
        self._handles.clear()
        self._contributors = None
        self._synchronized = False

    def _synchronize_for_step(self) -> bool:
        """What ``step()`` does first: synchronize unless the user already did (then warn
        if they did so outside ``skip_synchronize()``). Returns whether it synchronized."""
        synchronizes_here = self._should_synchronize and not self._synchronized
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() after "
                    "optimizer.synchronize(): hvdtrain does not average again, but Horovod "
                    "does; wrap step() in `with optimizer.skip_synchronize():`",
                    stacklevel=3)
            else:
                self.synchronize()
        return synchronizes_here

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

    def _holds_gradient_slices(self) -> bool:
        """Whether this worker's averaged gradients are its slices alone
        (:class:`.gradient_slices.SlicedGradients`); not here."""
        return False

    def _require_synchronized_for(self, what: str) -> None:
        if not self._synchronized:
            raise RuntimeError(f"{what} works on the averaged gradients: call "
                               "optimizer.synchronize() first, then step() inside "
                               "`with optimizer.skip_synchronize():`")

    def _make_hook(self, parameter: torch.Tensor):
        """Horovod's hook (start the allreduce when the gradient is ready) with overlap;
        without, a hook that only counts the backward passes."""
        if self.overlap:
            return _HorovodOptimizer._make_hook(self, parameter)

        def count_pass(*_) -> None:
            if self._allreduce_delay[parameter] <= 0:
                raise RuntimeError(
                    f"the gradient of {self._parameter_names.get(parameter, '<unnamed>')!r} "
                    f"was computed more than backward_passes_per_step="
                    f"{self.backward_passes_per_step} times before step(); raise "
                    "backward_passes_per_step to accumulate more micro-batches")
            self._allreduce_delay[parameter] -= 1

        return count_pass

    def _sends_flat(self) -> bool:
        """Whether this step's gradients go in one flat allreduce per dtype (no overlap, a
        group of workers, dense gradients, a format Horovod reduces) rather than through
        Horovod's per-tensor synchronize."""
        return (not self.overlap and self._wire.reduced_natively and bool(self._requires_update)
                and not any(p.grad is not None and p.grad.is_sparse
                            for p in self._requires_update))

    def _allreduce_flat(self, postscale: float) -> None:
        """Average the gradients in one allreduce per dtype and device, each on one
        contiguous copy of them, in place (so Horovod copies nothing in or out of its
        fusion buffer); afterwards every gradient is a view into its copy, and the
        non-finite check reads the copies (:meth:`_first_nonfinite_gradient`)."""
        by_kind: dict[tuple, list[torch.Tensor]] = {}
        for group in self.param_groups:
            for parameter in group["params"]:
                if parameter in self._requires_update:
                    if parameter.grad is None:  # another rank may have computed it
                        parameter.grad = torch.zeros_like(parameter)
                    by_kind.setdefault((parameter.dtype, parameter.device), []).append(
                        parameter)
        # Horovod's own split of an average (see its _allreduce_grad_async).
        predivide = self.gradient_predivide_factor if self.op == Average else 1.0
        pending = []
        for (dtype, device), parameters in by_kind.items():
            flat = self._pack([p.grad for p in parameters], dtype, device)
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
                gradients, contributors, finite = read_tally(
                    flat, unit, prescale=1.0 / predivide, largest=self._wire_largest(dtype))
                self._rescale_after_join(gradients, contributors)
                offset = 0
                for parameter in parameters:
                    size = parameter.numel()
                    parameter.grad = gradients[offset:offset + size].view_as(parameter)
                    offset += size
                self._flat_gradients.append((gradients, parameters, finite))
        self._finish_synchronize()

    def _finish_synchronize(self) -> None:
        """After the flat reduction: the next step counts its backward passes anew."""
        for parameter in self._allreduce_delay:
            self._allreduce_delay[parameter] = self.backward_passes_per_step
        self._handles.clear()
        self._synchronized = True

    def _pack(self, gradients: list[torch.Tensor], dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
        """One buffer of ``gradients`` and their tally (:func:`.tally.flat_with_tally`),
        with the bound only when the check is on."""
        return flat_with_tally(gradients, dtype, device, bound=self.on_nonfinite.checks)

    def _wire_largest(self, dtype: torch.dtype) -> float:
        """The largest finite number the gradients of ``dtype`` take on the wire (the
        limit of the bound's proof: :func:`hvdtrain.gradients.finite_bound_limit`)."""
        return self._wire.largest_for(torch.finfo(dtype).max)

    def _pending_allreduces(self) -> str:
        return self._describe_allreduce([p for key in list(self._handles)
                                         for p in (key if isinstance(key, tuple) else (key,))])

    def _describe_allreduce(self, parameters: list[torch.Tensor]) -> str:
        """What the watchdog reports when the allreduce of ``parameters`` hangs."""
        names = [f"allreduce.{self._parameter_names.get(p, '<unnamed>')}" for p in parameters]
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
                return self._parameter_names.get(parameter, "<unnamed>")
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

    def _allreduce_grad_async(self, parameter):
        if self._wire.reduced_natively or parameter.grad is None or parameter.grad.is_sparse:
            self._count_contributors()
            return _HorovodOptimizer._allreduce_grad_async(self, parameter)
        return bf16_allreduce_async(parameter.grad, self._parameter_names.get(parameter),
                                     self._reduce_op, self._tensors), None

    def _grouped_allreduce_grad_async(self, parameters):
        self._count_contributors()
        return _HorovodOptimizer._grouped_allreduce_grad_async(self, parameters)

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
        dense = [p.grad for p in self._requires_update
                 if p.grad is not None and not p.grad.is_sparse]
        self._rescale_after_join(dense, round(self._tensors.wait(handle).item()))

    def _rescale_after_join(self, gradients: torch.Tensor | list[torch.Tensor],
                            contributors: int) -> None:
        """Turn ``gradients``, averaged over every rank, into their average over the
        ``contributors`` (:func:`hvdtrain.gradients.joined_rescale`), in place, when
        some ranks had joined; remember whether all contributed."""
        size = self.process_set.size()
        self._all_contributed = not some_ranks_joined(contributors, size)
        if self.op != Average or self._all_contributed or contributors == 0:
            return
        factor = joined_rescale(contributors, size)
        for gradient in gradients if isinstance(gradients, list) else [gradients]:
            gradient.mul_(factor)

    def _on_any_rank(self, condition: bool) -> bool:
        """True on every rank of the process set when ``condition`` holds on at least
        one (:func:`hvdtrain.gradients.any_rank`); a rank outside the set decides
        alone."""
        if not self.process_set.included():
            return condition
        flag = torch.tensor([1.0 if condition else 0.0], dtype=torch.float64)
        with watchdog.guard("the non-finite gradient vote (hvdtrain.any_rank)"):
            return bool(any_rank(flag, self._tensors, "hvdtrain.any_rank"))

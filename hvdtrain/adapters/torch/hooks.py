"""The lowest class of the distributed optimizer: a torch optimizer whose parameters'
gradients are watched as ``backward()`` produces them, written over Horovod's public
collectives (Horovod's own optimizer keeps this machinery in private methods).

A hook on each trained parameter's gradient accumulator counts the backward passes
left before the step. With ``overlap``, the pass that ends the count starts that
gradient's allreduce at once (or, with ``groups``, the allreduce of its group when the
group is complete), so communication runs beside the rest of the backward pass;
:meth:`BackwardHooks.synchronize` then waits for every started allreduce, starts the
ones no hook started, and writes the averages into the gradients. Without overlap the
hooks only count, and :class:`.averaging.GradientAveraging` sends every gradient at
once.

The hooks are registered only where there is someone to average with (more than one
worker, or an elastic job, whose size may grow), as Horovod does.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Iterator
from typing import Any

import horovod.torch as hvd
import torch
from horovod.torch import Average, ProcessSet

from hvdtrain.adapters.torch._horovod import TorchTensors, tensors
from hvdtrain.adapters.torch.compression import horovod_compression
from hvdtrain.runtime import elastic_job

__all__ = ["BackwardHooks"]

# What a started allreduce is filed under: one parameter, or a tuple of them (a group).
Started = torch.Tensor | tuple[torch.Tensor, ...]


class BackwardHooks(torch.optim.Optimizer):
    """A subclass of the user's optimizer class sits above this one (see
    :func:`.optimizer.DistributedOptimizer`); it takes over the user's param groups and
    their state, and adds the hooks of the module.

    Args:
        optimizer: the user's optimizer, whose param groups and state are taken over.
        named_parameters: (name, parameter) pairs naming every parameter of it.
        compression: the wire format's name (None, "fp16", "bf16").
        backward_passes_per_step: backward passes counted before each step.
        op: Horovod's ``Average`` or ``Sum``.
        groups: Horovod's explicit grouping of the per-tensor allreduces (a number of
            groups, or lists of parameters), or None.
        overlap: whether the hooks start the allreduces during ``backward()``.
        gradient_predivide_factor: Horovod's split of an average into a pre- and a
            post-scaling.
        sparse_as_dense: whether sparse gradients travel as dense tensors.
        process_set: the Horovod process set whose ranks average.
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 named_parameters: list[tuple[str, torch.Tensor]], *,
                 compression: str | None, backward_passes_per_step: int, op,
                 groups: int | list[list[torch.Tensor]] | None, overlap: bool,
                 gradient_predivide_factor: float, sparse_as_dense: bool,
                 process_set: ProcessSet) -> None:
        super().__init__(optimizer.param_groups)
        self.defaults = optimizer.defaults  # the class's own defaults replaced them
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.overlap = overlap
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._compression = horovod_compression(compression)
        self._tensors: TorchTensors = tensors(process_set)
        self._parameter_names = {p: name for name, p in named_parameters}
        self._passes_left = {p: backward_passes_per_step for _, p in named_parameters}
        self._trained: list[torch.Tensor] = []  # the parameters the hooks watch
        self._started: dict[Started, tuple[Any, Any]] = {}  # allreduces: handle, context
        self._accumulators: list[Any] = []  # kept alive, so their hooks stay
        self._group_of: dict[torch.Tensor, tuple[torch.Tensor, ...]] = {}
        self._ready_in_group: dict[tuple[torch.Tensor, ...], int] = {}
        self._synchronized = False
        self._should_synchronize = True
        if process_set.included() and (hvd.size() > 1 or elastic_job()):
            self._register_hooks(groups)

    def name_of(self, parameter: torch.Tensor) -> str:
        """The name ``parameter`` was given (``named_parameters``), for messages."""
        return self._parameter_names.get(parameter, "<unnamed>")

    def _register_hooks(self, groups: int | list[list[torch.Tensor]] | None) -> None:
        """Watch every trained parameter's gradient accumulator; form the groups."""
        self._trained = [p for group in self.param_groups for p in group["params"]
                         if p.requires_grad]
        if groups is not None:
            self._form_groups(groups)
        for parameter in self._trained:
            # The accumulator node runs once the gradient is summed into p.grad.
            accumulator = parameter.view_as(parameter).grad_fn.next_functions[0][0]
            accumulator.register_hook(self._make_hook(parameter))
            self._accumulators.append(accumulator)

    def _form_groups(self, groups: int | list[list[torch.Tensor]]) -> None:
        """Split the trained parameters into the groups of one grouped allreduce each:
        the user's lists (each parameter not in one alone), or ``groups`` parts of
        about equal length in rank 0's order, which every rank takes."""
        names = hvd.broadcast_object([self.name_of(p) for p in self._trained], root_rank=0,
                                     process_set=self.process_set)
        position = {name: index for index, name in enumerate(names)}
        ordered = sorted(self._trained, key=lambda p: position[self.name_of(p)])
        if isinstance(groups, list):
            trained = {id(p) for p in ordered}
            parts = [[p for p in group if id(p) in trained] for group in groups]
            grouped = {id(p) for part in parts for p in part}
            parts += [[p] for p in ordered if id(p) not in grouped]
        else:
            size, extra = divmod(len(ordered), groups)
            bounds = [i * size + min(i, extra) for i in range(groups + 1)]
            parts = [ordered[start:end] for start, end in itertools.pairwise(bounds)]
        for part in (tuple(part) for part in parts if part):
            for parameter in part:
                self._group_of[parameter] = part
            self._ready_in_group[part] = 0

    def _make_hook(self, parameter: torch.Tensor):
        """The hook run after each backward pass's gradient of ``parameter`` is
        accumulated: count the pass; with overlap, start the allreduce after the last."""

        def count_pass(*_) -> None:
            if self._passes_left[parameter] <= 0:
                raise RuntimeError(
                    f"the gradient of {self.name_of(parameter)!r} was computed more than "
                    f"backward_passes_per_step={self.backward_passes_per_step} times before "
                    "step(); raise backward_passes_per_step to accumulate more micro-batches")
            self._passes_left[parameter] -= 1
            if self.overlap and self._passes_left[parameter] == 0:
                self._start_when_ready(parameter)

        return count_pass

    def _start_when_ready(self, parameter: torch.Tensor) -> None:
        """Start ``parameter``'s allreduce, or its group's once all of it is ready."""
        group = self._group_of.get(parameter)
        if group is None:
            self._started[parameter] = self._allreduce_grad_async(parameter)
            return
        self._ready_in_group[group] += 1
        if self._ready_in_group[group] == len(group):
            self._ready_in_group[group] = 0
            self._started[group] = self._grouped_allreduce_grad_async(group)

    def _allreduce_grad_async(self, parameter: torch.Tensor) -> tuple[Any, Any]:
        """Start the allreduce of one gradient; returns its handle and compression
        context. A missing gradient goes as zeros (another rank may have one); a sparse
        one is allgathered, unless ``sparse_as_dense``."""
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
        gradient = parameter.grad
        name = self.name_of(parameter)
        if gradient.is_sparse:
            if not self.sparse_as_dense:
                return hvd.sparse_allreduce_async(gradient, name=name, op=self.op,
                                                  process_set=self.process_set), None
            gradient = gradient.to_dense()
        wire, context = self._compression.compress(gradient)
        average = self.op == Average
        predivide = self.gradient_predivide_factor if average else 1.0
        handle = self._tensors.allreduce(wire, name, op="average" if average else "sum",
                                         prescale=1.0 / predivide, postscale=predivide)
        return handle, context

    def _grouped_allreduce_grad_async(self, group: tuple[torch.Tensor, ...]
                                      ) -> tuple[Any, Any]:
        """Start one grouped allreduce of a group's gradients (named after its first)."""
        wires, contexts = zip(*(self._compression.compress(p.grad) for p in group),
                              strict=True)
        return self._tensors.grouped_allreduce(
            list(wires), self.name_of(group[0]),
            op="average" if self.op == Average else "sum"), contexts

    def _synchronize_per_tensor(self) -> None:
        """Start what no hook started, wait for every allreduce and write the results
        into the gradients."""
        started = {p for key in self._started for p in (key if isinstance(key, tuple) else (key,))}
        for parameter in self._trained:
            if parameter not in started:
                self._started[parameter] = self._allreduce_grad_async(parameter)
        for key, (handle, context) in self._started.items():
            if isinstance(key, tuple):
                for parameter, output, part in zip(key, self._tensors.wait(handle), context,
                                                   strict=True):
                    parameter.grad.set_(self._compression.decompress(output, part))
                continue
            output = handle() if callable(handle) else self._tensors.wait(handle)
            averaged = self._compression.decompress(output, context)
            if key.grad.is_sparse:  # a sparse gradient cannot take set_
                key.grad.zero_().add_(averaged if averaged.is_sparse else averaged.to_sparse())
            else:
                key.grad.set_(averaged)
        self._finish_synchronize()

    def _finish_synchronize(self) -> None:
        """After a reduction: the next step counts its backward passes anew."""
        self._forget_started()
        self._synchronized = True

    def _forget_started(self) -> None:
        """Reset the count of backward passes (and of each group's ready gradients) and
        drop the started allreduces."""
        for parameter in self._passes_left:
            self._passes_left[parameter] = self.backward_passes_per_step
        for group in self._ready_in_group:
            self._ready_in_group[group] = 0
        self._started.clear()

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within it, ``step()`` applies the gradients as they are, without averaging
        (after the user's own ``synchronize()``, e.g. to unscale or clip in between)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Count ``passes`` backward passes per step from now on (Horovod's)."""
        self.backward_passes_per_step = passes
        self._forget_started()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's, refused while allreduces started by ``backward()`` are in flight
        (they would write into the cleared gradients)."""
        if self._started:
            raise RuntimeError("optimizer.zero_grad() after loss.backward() and before "
                               "optimizer.step() or optimizer.synchronize(): the gradients' "
                               "allreduces are still in flight; call zero_grad() before the "
                               "backward pass or after the step")
        super().zero_grad(set_to_none=set_to_none)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's, forgetting any step in progress."""
        self._forget_started()
        self._synchronized = False
        self._should_synchronize = True
        super().load_state_dict(state_dict)

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

    def synchronize(self) -> None:
        """Finish the allreduce of every gradient (here: per tensor)."""
        if self.process_set.included():
            self._synchronize_per_tensor()
        else:  # nothing to average with (Horovod's meaning)
            self._synchronized = True

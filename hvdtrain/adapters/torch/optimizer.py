"""``DistributedOptimizer``: Horovod's gradient averaging for any torch optimizer, with
hvdtrain's additions (averaging over micro-batches, bf16 on the wire, a start-time
agreement check, the non-finite check, the collective watchdog)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import horovod.torch as _hvd
import torch
from horovod.torch import Adasum, Average, Compression, Sum

# Horovod's optimizer class: its methods add the gradient hooks, fusion and
# synchronize(); DistributedOptimizer builds on them (see _distributed_class).
from horovod.torch.optimizer import _DistributedOptimizer as _HorovodOptimizer

from hvdtrain import watchdog
from hvdtrain.adapters.torch._horovod import allgather_object, require_initialized
from hvdtrain.consistency import (
    RankDisagreementError,
    first_parameter_difference,
    raise_on_disagreement,
    software_versions,
)
from hvdtrain.nonfinite import NonFiniteGradientError, nonfinite_gradient_message
from hvdtrain.validation import require_compression, require_instance, require_positive_int

__all__ = ["DistributedOptimizer", "NonFiniteGradientError", "ParameterMismatchError"]

# bf16 travels through Horovod's allgather (_bf16_allreduce_async), so Horovod sees none.
_HOROVOD_COMPRESSION = {None: Compression.none, "fp16": Compression.fp16,
                        "bf16": Compression.none}


class ParameterMismatchError(RankDisagreementError):
    """The ranks' models differ (names, shapes or dtypes), so their gradients cannot be averaged."""


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    *,
    compression: Any = None,
    backward_passes_per_step: int = 1,
    op=Average,
    groups: int | list[list[torch.Tensor]] | None = None,
    skip_nonfinite: bool = False,
    check_nonfinite: bool = True,
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that its gradients are averaged over all workers.

    Returns an instance of a subclass of ``type(optimizer)`` with the same param
    groups and state: ``step``, ``zero_grad``, ``state_dict``, ``load_state_dict``,
    ``add_param_group`` behave as before, and each gradient's allreduce starts
    during ``backward()`` (Horovod's hooks and tensor fusion).

    Args:
        optimizer: any ``torch.optim.Optimizer``.
        named_parameters: ``model.named_parameters()``; names the allreduces and the
            parameters in error messages.
        compression: None, "fp16" (Horovod's fp16 allreduce) or "bf16" (bfloat16 on the
            wire through Horovod's allgather, since Horovod has no bfloat16 reduction;
            it carries fewer bytes than a float32 allreduce only up to 3 workers).
            Horovod's ``Compression.none``/``Compression.fp16`` are accepted too.
        backward_passes_per_step: micro-batches accumulated per step. The applied
            gradient is the mean over the micro-batches and workers, so the loss needs
            no manual scaling (Horovod's own wrapper leaves that 1/N to you).
        op: ``Average`` (default), ``Sum`` or ``Adasum``.
        groups: Horovod's explicit allreduce grouping (an int or lists of parameters).
        skip_nonfinite: skip, on every rank alike, a step whose averaged gradient has a
            NaN or Inf; ``optimizer.skipped_steps`` counts them.
        check_nonfinite: without ``skip_nonfinite``, raise NonFiniteGradientError (on every
            rank, naming the parameter and step) when the averaged gradient has a NaN or
            Inf. The check reads every gradient once more per step (its cost is in
            README.md, "Benchmarks"); pass False to drop it.

    Returns:
        The distributed optimizer; ``skipped_steps`` and ``steps_taken`` count its steps.

    Raises:
        ParameterMismatchError: on every rank, when the ranks' parameters differ in
            names, shapes or dtypes (names the rank, the parameter and both values).
        RankDisagreementError: on every rank, when the ranks' settings or software differ.

    With ``torch.amp.GradScaler``, call ``optimizer.synchronize()`` before
    ``scaler.unscale_(optimizer)`` or ``scaler.step(optimizer)``; ``step()`` then does
    not synchronize again.
    """
    require_initialized("DistributedOptimizer")
    require_instance("optimizer", optimizer, torch.optim.Optimizer,
                     "a torch.optim.Optimizer, e.g. torch.optim.SGD(model.parameters(), lr=0.1)")
    compression = _compression_name(compression)
    require_positive_int("backward_passes_per_step", backward_passes_per_step)
    if op not in (Average, Sum, Adasum):
        raise ValueError("op must be hvt.Average, hvt.Sum or hvt.Adasum")
    if compression == "bf16" and groups is not None:
        raise ValueError("compression='bf16' cannot be combined with groups: Horovod's grouped "
                         "allreduce has no bfloat16 path; drop one of them")
    if op == Adasum and (backward_passes_per_step > 1 or skip_nonfinite
                         or compression == "bf16"):
        raise ValueError("op=Adasum is passed straight to Horovod's Adasum optimizer; it does "
                         "not support backward_passes_per_step > 1, skip_nonfinite or bf16")

    named = _named_parameters(optimizer, named_parameters)
    _check_start_agreement(named, {
        "optimizer class": type(optimizer).__name__,
        "number of param groups": len(optimizer.param_groups),
        "backward_passes_per_step": backward_passes_per_step,
        "compression": compression,
        "op": int(op),
        "skip_nonfinite": skip_nonfinite,
        **software_versions("torch", "horovod"),
    })
    if op == Adasum:
        return _hvd.DistributedOptimizer(optimizer, named,
                                         compression=_HOROVOD_COMPRESSION[compression], op=Adasum)
    return _distributed_class(type(optimizer))(
        optimizer, named, compression=compression,
        backward_passes_per_step=backward_passes_per_step, op=op, groups=groups,
        skip_nonfinite=skip_nonfinite, check_nonfinite=check_nonfinite)


class _CheckedAveraging:
    """hvdtrain's layer over Horovod's distributed optimizer: worker- and micro-batch-
    averaged gradients, checked for NaN/Inf and watched while they are awaited.

    Horovod's methods call ``super(self.__class__, self)``, so its optimizer cannot be
    subclassed; instead these methods sit beside Horovod's in one class whose base is
    the user's optimizer class (:func:`_distributed_class`), and call Horovod's
    explicitly.
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 named_parameters: list[tuple[str, torch.Tensor]], *,
                 compression: str | None, backward_passes_per_step: int, op,
                 groups: int | list[list[torch.Tensor]] | None,
                 skip_nonfinite: bool, check_nonfinite: bool) -> None:
        _HorovodOptimizer.__init__(self, optimizer.param_groups, named_parameters,
                                   _HOROVOD_COMPRESSION[compression], backward_passes_per_step,
                                   op, 1.0, groups)
        self.defaults = optimizer.defaults  # Horovod rebuilds with the class's defaults
        self.skip_nonfinite = skip_nonfinite
        self.check_nonfinite = check_nonfinite or skip_nonfinite
        self.skipped_steps = 0
        self.steps_taken = 0
        self._bf16 = compression == "bf16"
        self.load_state_dict(optimizer.state_dict())  # keep state built before wrapping

    def synchronize(self) -> None:
        """Finish the allreduce of every gradient; afterwards each holds the mean over
        all workers and, with ``backward_passes_per_step > 1``, over the micro-batches."""
        # Horovod counts down backward passes per parameter; read them before it resets.
        passes = {p: self.backward_passes_per_step - left
                  for p, left in self._allreduce_delay.items()}
        with watchdog.guard(self._pending_allreduces):
            _HorovodOptimizer.synchronize(self)
        if self.backward_passes_per_step > 1:
            for parameter, count in passes.items():
                if count > 1 and parameter.grad is not None:
                    parameter.grad.div_(count)

    def step(self, closure=None):
        """Synchronize (unless already done), then apply the averaged gradients.

        With ``skip_nonfinite=True``, a step whose averaged gradient has a NaN or Inf
        on any rank is skipped on every rank and counted in ``skipped_steps``.
        """
        if self._should_synchronize and not self._synchronized:
            self.synchronize()
        step, self.steps_taken = self.steps_taken, self.steps_taken + 1
        nonfinite = self._first_nonfinite_gradient() if self.check_nonfinite else None
        if self.skip_nonfinite and _on_any_rank(nonfinite is not None):
            self.skipped_steps += 1
            self._synchronized = False
            return None
        if nonfinite is not None:
            raise NonFiniteGradientError(nonfinite_gradient_message(step, nonfinite))
        with self.skip_synchronize():
            return _HorovodOptimizer.step(self, closure)

    def _pending_allreduces(self) -> str:
        names = [f"allreduce.{self._parameter_names.get(p, '<unnamed>')}"
                 for p in list(self._handles)]
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        return f"the gradient allreduce of step {self.steps_taken} ({shown})"

    def _first_nonfinite_gradient(self) -> str | None:
        """The name of the first parameter whose (averaged) gradient is not finite."""
        parameters = [p for group in self.param_groups for p in group["params"]
                      if p.grad is not None]
        if not parameters:
            return None
        # A NaN or Inf anywhere makes the sum non-finite: one read of each gradient and
        # one device synchronisation in the common case. Only a sum that overflows
        # without any non-finite element needs the exact look below.
        if bool(torch.isfinite(torch.stack([p.grad.sum() for p in parameters]).sum())):
            return None
        for parameter in parameters:
            if not bool(torch.isfinite(parameter.grad).all()):
                return self._parameter_names.get(parameter, "<unnamed>")
        return None

    def _allreduce_grad_async(self, parameter):
        if not self._bf16 or parameter.grad is None or parameter.grad.is_sparse:
            return _HorovodOptimizer._allreduce_grad_async(self, parameter)
        return _bf16_allreduce_async(parameter.grad, self._parameter_names.get(parameter),
                                     self.op), None


def _distributed_class(base: type) -> type:
    """A class with ``base`` as its base, Horovod's optimizer methods and ours on top."""
    methods = dict(vars(_HorovodOptimizer))
    methods.update((name, member) for name, member in vars(_CheckedAveraging).items()
                   if name == "__init__" or not name.startswith("__"))
    methods["__doc__"] = f"{base.__name__} with gradients averaged over Horovod workers."
    return type(base.__name__, (base,), methods)


def _on_any_rank(condition: bool) -> bool:
    """True on every rank when ``condition`` holds on at least one (one scalar allreduce)."""
    flag = torch.tensor(1.0 if condition else 0.0, dtype=torch.float64)
    with watchdog.guard("the non-finite gradient vote (hvdtrain.any_rank)"):
        return _hvd.allreduce(flag, op=Sum, name="hvdtrain.any_rank").item() > 0


def _bf16_allreduce_async(gradient: torch.Tensor, name: str, op) -> Any:
    """Average (or sum) ``gradient`` across ranks with bfloat16 on the wire.

    Horovod 0.28.1 has no bfloat16 reduction, so the bfloat16 bits travel as int16
    through Horovod's allgather and each rank adds the ranks' values in rank order
    in the gradient's own dtype: every rank gets the identical result.
    """
    bits = gradient.detach().to(torch.bfloat16).reshape(1, -1).view(torch.int16)
    handle = _hvd.allgather_async(bits, name=f"{name}.bf16")

    def reduced() -> torch.Tensor:
        gathered = _hvd.synchronize(handle).view(torch.bfloat16).to(gradient.dtype)
        total = gathered.sum(dim=0)
        if op == Average:
            total /= gathered.shape[0]
        return total.view_as(gradient)

    return reduced


def _compression_name(compression: Any) -> str | None:
    """hvdtrain's name for ``compression``, which may also be Horovod's object."""
    if compression is Compression.none:
        return None
    if compression is Compression.fp16:
        return "fp16"
    require_compression(compression)
    return compression


def _named_parameters(optimizer: torch.optim.Optimizer,
                      named_parameters: Iterable[tuple[str, torch.Tensor]] | None
                      ) -> list[tuple[str, torch.Tensor]]:
    if named_parameters is not None:
        return list(named_parameters)
    return [(f"param_group{i}.{j}", p) for i, group in enumerate(optimizer.param_groups)
            for j, p in enumerate(group["params"])]


def _check_start_agreement(named_parameters: list[tuple[str, torch.Tensor]],
                           facts: dict[str, Any]) -> None:
    """One allgather: every rank's parameter names, shapes and dtypes, and ``facts``.

    Raises ParameterMismatchError or RankDisagreementError on every rank, naming the
    rank, the parameter or field, and both values.
    """
    mine = [(name, tuple(p.shape), str(p.dtype)) for name, p in named_parameters]
    everyone = allgather_object({"parameters": mine, "facts": facts},
                                "hvdtrain.start_agreement")
    problem = first_parameter_difference([rank["parameters"] for rank in everyone])
    if problem:
        raise ParameterMismatchError(
            f"the ranks' models differ: {problem}. Every rank must build the same model "
            "(same layers, shapes and dtypes, in the same order) before wrapping its optimizer."
        )
    raise_on_disagreement([rank["facts"] for rank in everyone], "DistributedOptimizer")

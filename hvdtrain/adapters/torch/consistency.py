"""What the ranks must agree on before their gradients can be averaged: the named
parameters (checked as Horovod checks them) and, in one allgather at construction of
the distributed optimizer, their names, shapes and dtypes and the optimizer's settings."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch
from horovod.torch import ProcessSet

from hvdtrain.adapters.torch._horovod import collective
from hvdtrain.collective import gather
from hvdtrain.consistency import (
    RankDisagreementError,
    first_parameter_difference,
    raise_on_disagreement,
)

__all__ = ["ParameterMismatchError", "check_start_agreement", "named_parameters_of"]


class ParameterMismatchError(RankDisagreementError):
    """The ranks' models differ (names, shapes or dtypes), so their gradients cannot be averaged."""


def named_parameters_of(optimizer: torch.optim.Optimizer,
                      named_parameters: Iterable[tuple[str, torch.Tensor]] | None
                      ) -> list[tuple[str, torch.Tensor]]:
    """The optimizer's parameters with their names, checked as Horovod checks them.

    Args:
        optimizer: the optimizer being wrapped.
        named_parameters: ``model.named_parameters()``, or None to name each parameter
            by its param group and position.

    Returns:
        The (name, parameter) pairs, as a list.

    Raises:
        ValueError: when the pairs are malformed, a name repeats, or some of the
            optimizer's parameters are not named.
    """
    if named_parameters is None:
        return [(f"param_group{i}.{j}", p) for i, group in enumerate(optimizer.param_groups)
                for j, p in enumerate(group["params"])]
    named = list(named_parameters)
    if not all(isinstance(pair, tuple) and len(pair) == 2 for pair in named):
        raise ValueError("named_parameters must hold (name, parameter) pairs, as "
                         "model.named_parameters() gives them")
    duplicates = sorted(name for name, count in Counter(name for name, _ in named).items()
                        if count > 1)
    if duplicates:
        raise ValueError(f"named_parameters has duplicate names: {', '.join(duplicates)}. "
                         "Names pair each allreduce across ranks; prefix each model's "
                         "names (e.g. [('gen.' + n, p) for n, p in gen.named_parameters()])")
    named_ids = {id(p) for _, p in named}
    unnamed = sum(id(p) not in named_ids for group in optimizer.param_groups
                  for p in group["params"])
    if unnamed:
        raise ValueError(f"{unnamed} of the optimizer's parameters are not in "
                         "named_parameters; pass model.named_parameters() of the model "
                         "whose parameters the optimizer holds (or leave it None)")
    return named


def check_start_agreement(named_parameters: list[tuple[str, torch.Tensor]],
                           process_set: ProcessSet, facts: dict[str, Any]) -> None:
    """One allgather over ``process_set``: every rank's parameter names, shapes and
    dtypes, and ``facts``.

    Raises ParameterMismatchError or RankDisagreementError on every rank, naming the
    rank, the parameter or field, and both values.
    """
    mine = [(name, tuple(p.shape), str(p.dtype)) for name, p in named_parameters]
    everyone = gather(collective(process_set), {"parameters": mine, "facts": facts},
                      "hvdtrain.start_agreement")
    problem = first_parameter_difference([rank["parameters"] for rank in everyone])
    if problem:
        raise ParameterMismatchError(
            f"the ranks' models differ: {problem}. Every rank must build the same model "
            "(same layers, shapes and dtypes, in the same order) before wrapping its optimizer."
        )
    raise_on_disagreement([rank["facts"] for rank in everyone], "DistributedOptimizer")

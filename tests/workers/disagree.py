"""Rank 1 starts differently from rank 0 in one way per check; every check must raise on
both ranks before the first step. Prints ``REPORT {json}`` per check."""

import json

import torch

import hvdtrain
import hvdtrain.adapters.torch as hvt

hvt.init()
DIFFERENT = hvt.rank() == 1


def report(check: str, error: Exception | None) -> None:
    print("REPORT " + json.dumps({"rank": hvt.rank(), "check": check,
                                  "error": None if error is None else str(error)}), flush=True)


def attempt(check: str, action) -> None:
    try:
        action()
        report(check, None)
    except hvt.RankDisagreementError as error:
        report(check, error)


model = torch.nn.Linear(4, 2)
attempt("optimizer class", lambda: hvt.DistributedOptimizer(
    (torch.optim.Adam if DIFFERENT else torch.optim.SGD)(model.parameters(), lr=0.1),
    model.named_parameters()))
attempt("param groups", lambda: hvt.DistributedOptimizer(torch.optim.SGD(
    [{"params": [model.weight]}, {"params": [model.bias]}] if DIFFERENT
    else model.parameters(), lr=0.1), model.named_parameters()))
optimizer = hvt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     model.named_parameters())
attempt("batch size", lambda: hvt.LinearScalingWarmup(
    optimizer, batch_size_per_worker=16 if DIFFERENT else 32, steps_per_epoch=10))
if DIFFERENT:
    hvdtrain.__version__ = "0.0.0-other"
attempt("versions", lambda: hvt.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters()))

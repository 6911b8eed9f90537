"""What the PyTorch worker and its test build alike: data, model, optimizers, reference runs.

The worker (tests/workers/torch_adapter.py) trains on 2 ranks through hvdtrain; the
test repeats the same training in one plain-PyTorch process on the concatenated
batch, which is the independent computation the distributed run must equal.
"""

import torch

from hvdtrain.schedule import LinearScalingSchedule

FEATURES, HIDDEN, CLASSES = 6, 5, 3
BATCH_PER_WORKER = 4
WORKERS = 2
STEPS = 20
STEPS_PER_EPOCH = 5
WARMUP_EPOCHS = 2
# Optimizer steps per rank in the uneven-shares (join) scenario.
JOIN_STEPS = (3, 2)


def numbered_problem(samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The elastic workers' data (tests/workers/torch_elastic_train.py): sample i is
    (x_i, y_i) of a fixed float64 linear problem with 4 features."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 4, generator=generator, dtype=torch.float64)
    return x, x @ torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)


def make_data(steps: int = STEPS, dtype=torch.float64,
              workers: int = WORKERS) -> tuple[torch.Tensor, torch.Tensor]:
    """Enough rows for ``steps`` steps of the largest global batch used here (4 passes
    of ``workers`` workers)."""
    generator = torch.Generator().manual_seed(7)
    count = steps * BATCH_PER_WORKER * workers * 4
    x = torch.randn(count, FEATURES, generator=generator, dtype=torch.float64)
    y = torch.randint(0, CLASSES, (count,), generator=generator)
    return x.to(dtype), y


def make_model(seed: int = 123, dtype=torch.float64, hidden: int = HIDDEN) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, CLASSES)
    ).to(dtype)


def make_optimizer(kind: str, parameters) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(parameters, lr=0.05, momentum=0.9)
    if kind == "adam":
        return torch.optim.Adam(parameters, lr=0.01, weight_decay=0.01)
    if kind == "adamw":
        return torch.optim.AdamW(parameters, lr=0.01, weight_decay=0.1)
    raise ValueError(kind)


def schedule(backward_passes_per_step: int = 1, base_lr: float = 1.0,
             workers: int = WORKERS) -> LinearScalingSchedule:
    """The schedule both sides use: base batch = one worker's batch, so k = workers x
    passes."""
    return LinearScalingSchedule(
        base_lr=base_lr, batch_size_per_worker=BATCH_PER_WORKER, world_size=workers,
        steps_per_epoch=STEPS_PER_EPOCH, base_batch_size=BATCH_PER_WORKER,
        warmup_epochs=WARMUP_EPOCHS, backward_passes_per_step=backward_passes_per_step,
    )


def rows(step: int, micro_batch: int, rank: int, passes: int, workers: int = WORKERS) -> slice:
    """The rows rank ``rank`` of ``workers`` trains on in micro-batch ``micro_batch`` of
    step ``step``."""
    start = ((step * passes + micro_batch) * workers + rank) * BATCH_PER_WORKER
    return slice(start, start + BATCH_PER_WORKER)


def global_rows(step: int, passes: int, workers: int = WORKERS) -> slice:
    """All rows of step ``step``: what one process sees on the concatenated batch."""
    size = workers * passes * BATCH_PER_WORKER
    return slice(step * size, (step + 1) * size)


def loss_fn(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(x), y)


def reference_run(kind: str, passes: int = 1, steps: int = STEPS, clip: float | None = None,
                  warmup: bool = True, optimizer_state: dict | None = None,
                  dtype: torch.dtype = torch.float64,
                  workers: int = WORKERS) -> dict[str, torch.Tensor]:
    """One process, batch = all ``workers``' micro-batches, LR from hvdtrain.schedule (or
    constant without ``warmup``), the gradient clipped to norm ``clip`` when given by
    torch's own clip_grad_norm_. ``optimizer_state``, a dict, receives the optimizer's
    state_dict() at the end; ``dtype``: the model's and the data's."""
    x, y = make_data(dtype=dtype, workers=workers)
    model = make_model(dtype=dtype)
    optimizer = make_optimizer(kind, model.parameters())
    plan = schedule(passes, base_lr=optimizer.param_groups[0]["lr"], workers=workers)
    for step in range(steps):
        if warmup:
            for group in optimizer.param_groups:
                group["lr"] = plan.lr_at(step)
        optimizer.zero_grad()
        part = global_rows(step, passes, workers)
        loss_fn(model, x[part], y[part]).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
    if optimizer_state is not None:
        optimizer_state.update(optimizer.state_dict())
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def train_uneven_share(rank: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                       x: torch.Tensor, y: torch.Tensor) -> None:
    """Rank ``rank``'s part of the join scenario: its JOIN_STEPS[rank] steps on its rows
    (the caller then joins)."""
    for step in range(JOIN_STEPS[rank]):
        optimizer.zero_grad()
        part = rows(step, 0, rank, 1)
        loss_fn(model, x[part], y[part]).backward()
        optimizer.step()


def uneven_reference_run(joined_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """One process on the uneven shares of the join scenario: while both ranks have
    data a step sees both batches, afterwards rank 0's alone. ``joined_scale`` scales
    the gradient of those later steps (0.5 is Horovod's average over every rank)."""
    x, y = make_data()
    model = make_model()
    optimizer = make_optimizer("sgd", model.parameters())
    for step in range(max(JOIN_STEPS)):
        optimizer.zero_grad()
        ranks = [rank for rank, steps in enumerate(JOIN_STEPS) if step < steps]
        shares = [rows(step, 0, rank, 1) for rank in ranks]
        loss_fn(model, torch.cat([x[share] for share in shares]),
                torch.cat([y[share] for share in shares])).backward()
        if len(ranks) < WORKERS:
            for parameter in model.parameters():
                parameter.grad.mul_(joined_scale)
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}

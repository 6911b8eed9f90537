"""Goyal et al. 2017's Table 1 at small scale, on every rank of a 2-rank horovodrun job:
``python goyal_worker.py RUNS.json``.

RUNS.json holds ``{"epochs", "milestones", "runs": [{"label", "batch_per_worker",
"eta", "warmup", "seed"}, ...]}``. Each run trains a fresh MLP (64-128-128-10) on
scikit-learn's digits (1437 training, 360 validation images) with SGD (momentum 0.9,
weight decay 1e-4) through hvdtrain's DistributedOptimizer; the global batch is
2 x batch_per_worker, so k = global batch / 32 and the learning rate follows
``warmup``:

- ``gradual``: hvdtrain's LinearScalingWarmup (η rising linearly to kη over 5 epochs);
- ``none``: kη from the first step (LinearScalingWarmup with warmup_epochs=0);
- ``constant``: η for the first 5 epochs, then kη (the paper's constant warmup).

All decay by 10x at each milestone epoch. Rank 0 prints ``RESULT {json}`` with, per
run, the final validation error and the training loss of every epoch (mean over ranks).
"""

import json
import sys

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvdtrain.adapters.torch as hvt
from hvdtrain.schedule import LinearScalingSchedule

BASE_BATCH, WARMUP_EPOCHS, GAMMA = 32, 5, 0.1


def digits() -> tuple[torch.Tensor, ...]:
    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(
        x / 16.0, y, test_size=360, stratify=y, random_state=0)
    return (torch.tensor(x_train, dtype=torch.float32), torch.tensor(y_train),
            torch.tensor(x_val, dtype=torch.float32), torch.tensor(y_val))


def constant_warmup_lr(no_warmup: LinearScalingSchedule, step: int) -> float:
    """η for the first WARMUP_EPOCHS epochs, then the no-warmup schedule (kη, decayed)."""
    if step < WARMUP_EPOCHS * no_warmup.steps_per_epoch:
        return no_warmup.base_lr
    return no_warmup.lr_at(step)


def train(run: dict, epochs: int, milestones: list[int], data) -> dict:
    x_train, y_train, x_val, y_val = data
    torch.manual_seed(run["seed"])
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))
    optimizer = hvt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=run["eta"], momentum=0.9, weight_decay=1e-4),
        model.named_parameters())
    per_worker, workers = run["batch_per_worker"], hvt.size()
    global_batch = per_worker * workers
    steps_per_epoch = len(x_train) // global_batch
    scheduler = hvt.LinearScalingWarmup(
        optimizer, batch_size_per_worker=per_worker, steps_per_epoch=steps_per_epoch,
        base_batch_size=BASE_BATCH, milestones=milestones, gamma=GAMMA,
        warmup_epochs=WARMUP_EPOCHS if run["warmup"] == "gradual" else 0)
    hvt.broadcast_state(model, optimizer, scheduler)
    no_warmup = scheduler.schedule_for(run["eta"])
    losses = []
    for epoch in range(epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(
            run["seed"] * 1000 + epoch))
        epoch_loss = 0.0
        for batch in range(steps_per_epoch):
            rows = order[batch * global_batch:(batch + 1) * global_batch]
            mine = rows[hvt.rank() * per_worker:(hvt.rank() + 1) * per_worker]
            if run["warmup"] == "constant":
                for group in optimizer.param_groups:
                    group["lr"] = constant_warmup_lr(no_warmup, epoch * steps_per_epoch + batch)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x_train[mine]), y_train[mine])
            loss.backward()
            optimizer.step()
            scheduler.step()
            epoch_loss += loss.item()
        losses.append(hvt.average_metrics({"loss": epoch_loss / steps_per_epoch})["loss"])
    with torch.no_grad():
        error = float((model(x_val).argmax(dim=1) != y_val).float().mean())
    return {**run, "k": global_batch / BASE_BATCH, "steps_per_epoch": steps_per_epoch,
            "val_error": error, "train_loss": losses}


def main() -> None:
    with open(sys.argv[1]) as file:
        spec = json.load(file)
    torch.set_num_threads(1)
    hvt.init()
    data = digits()
    results = [train(run, spec["epochs"], spec["milestones"], data) for run in spec["runs"]]
    if hvt.rank() == 0:
        print("RESULT " + json.dumps({"workers": hvt.size(), "runs": results}), flush=True)


if __name__ == "__main__":
    main()

"""Goyal et al. 2017's Table 1 in small, on every rank of a 2-rank horovodrun job:
``python goyal_worker.py SPEC.json``.

SPEC.json holds ``{"data": NPZ, "epochs", "milestones", "base_batch", "runs": [...],
"verify": [...]}``. NPZ (written by goyal.py) holds MNIST-1D's training and
validation arrays ``x``, ``y``, ``x_val``, ``y_val``.

Each run ``{"label", "k", "eta", "warmup", "seeds", "micro_batch", "passes", "bn_group"}``
trains a fresh 1-D conv net per seed, side by side in one model (:func:`make_model`;
each copy sees its seed's order of the data; with batch normalisation over groups of
``bn_group`` examples when that is not null) with SGD (momentum 0.9, weight decay 1e-4)
through hvdtrain's DistributedOptimizer. The global batch is k x base_batch: each of
the 2 ranks runs ``passes`` backward passes of ``micro_batch`` examples per optimizer
step (``backward_passes_per_step``, averaged: ``average_aggregated_gradients=True``),
so k counts ranks x passes, and the rate follows
``warmup``:

- ``gradual``: hvdtrain's LinearScalingWarmup (η rising linearly to kη over 5 epochs);
- ``none``: kη from the first step (LinearScalingWarmup with warmup_epochs=0);
- ``constant``: η for the first 5 epochs, then kη (the paper's constant warmup).

All decay by 10x at each milestone epoch; every k trains the same number of epochs,
so a larger k takes fewer steps. Each check of ``verify`` (a list of ``{"passes",
"micro_batch", "steps", "bn_group"}``) first shows that accumulation is exact: the
2-rank run with ``passes`` backward passes per step against one plain-PyTorch process
on the concatenated batch, in float64 and float32 (with batch normalisation, the
process normalises each group of ``bn_group`` consecutive examples on its own, as each
emulated worker does). Rank 0 prints ``RESULT {json}``, whose ``runs`` hold one result
per seed.
"""

import json
import sys
import time
from collections.abc import Sequence

import numpy as np
import torch

import hvdtrain.adapters.torch as hvt
from hvdtrain.schedule import LinearScalingSchedule

WARMUP_EPOCHS, GAMMA, MOMENTUM, WEIGHT_DECAY = 5, 0.1, 0.9, 1e-4


class GroupBatchNorm1d(torch.nn.BatchNorm1d):
    """Batch normalisation whose training statistics are those of each group of
    ``group`` consecutive examples of the batch, on its own: as if each group were one
    worker's batch (Goyal et al. 2017, section 2.3: the BN batch size n is a property of
    the model, whatever the number of workers). Evaluation uses the running statistics,
    updated with the mean of the groups' statistics."""

    def __init__(self, channels: int, group: int) -> None:
        super().__init__(channels)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        batch, channels, length = x.shape
        if batch % self.group:
            raise ValueError(f"a batch of {batch} does not split into BN groups of {self.group}")
        groups = batch // self.group
        if groups == 1:
            return super().forward(x)
        grouped = x.view(groups, self.group, channels, length)
        mean = grouped.mean(dim=(1, 3), keepdim=True)
        var = grouped.var(dim=(1, 3), unbiased=False, keepdim=True)
        with torch.no_grad():
            count = self.group * length
            self.running_mean.lerp_(mean.mean(dim=0).view(channels), self.momentum)
            self.running_var.lerp_(var.mean(dim=0).view(channels) * count / (count - 1),
                                   self.momentum)
            self.num_batches_tracked += 1
        normalised = (grouped - mean) * torch.rsqrt(var + self.eps)
        return (normalised * self.weight.view(1, 1, channels, 1)
                + self.bias.view(1, 1, channels, 1)).view(batch, channels, length)


def make_model(seeds: Sequence[int], dtype: torch.dtype = torch.float32,
               bn_group: int | None = None) -> torch.nn.Module:
    """``len(seeds)`` independent copies of one net, side by side: two strided 1-D
    convolutions (16 channels) and a linear classifier over 40 steps, 2.5 k parameters
    per copy. Without ``bn_group`` no normalisation layer, so how a batch is split into
    micro-batches does not change the gradient; with it, each convolution is followed
    by :class:`GroupBatchNorm1d` over groups of ``bn_group`` examples.

    Copy ``i`` is initialised as a net made alone after ``torch.manual_seed(seeds[i])``,
    reads channel ``i`` of the input ``(batch, copies, 40)`` and writes ``[:, i]`` of
    the logits ``(batch, copies, 10)``. Each layer holds the copies as the groups of a
    grouped convolution (the classifier is a convolution as wide as its input), so one
    forward and backward pass trains every copy, each on its own: on this small net a
    step's fixed cost, not its arithmetic, is most of the time at small batches."""
    copies = len(seeds)

    def norm() -> list[torch.nn.Module]:
        return [] if bn_group is None else [GroupBatchNorm1d(16 * copies, bn_group)]

    first = torch.nn.Conv1d(copies, 16 * copies, 5, stride=2, padding=2, groups=copies)
    second = torch.nn.Conv1d(16 * copies, 16 * copies, 3, stride=2, padding=1, groups=copies)
    classifier = torch.nn.Conv1d(16 * copies, 10 * copies, 10, groups=copies)
    with torch.no_grad():
        for i, seed in enumerate(seeds):
            torch.manual_seed(seed)  # the order a lone net draws its initial values in
            alone = (torch.nn.Conv1d(1, 16, 5), torch.nn.Conv1d(16, 16, 3),
                     torch.nn.Linear(16 * 10, 10))
            for layer, source in zip((first, second, classifier), alone, strict=True):
                width = source.weight.shape[0]
                layer.weight[i * width:(i + 1) * width] = source.weight.view(
                    width, *layer.weight.shape[1:])
                layer.bias[i * width:(i + 1) * width] = source.bias
    return torch.nn.Sequential(
        first, *norm(), torch.nn.ReLU(), second, *norm(), torch.nn.ReLU(), classifier,
        torch.nn.Unflatten(1, (copies, 10)), torch.nn.Flatten(2)).to(dtype)


def copy_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each copy's mean cross-entropy (one value per copy) from the stacked model's
    ``(batch, copies, 10)`` logits and ``(batch, copies)`` labels. Their sum is what to
    backpropagate: the copies share no parameter, so each gets its own gradient."""
    return torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels,
                                             reduction="none").mean(dim=0)


def sgd(model: torch.nn.Module, lr: float) -> torch.optim.SGD:
    """The benchmark's optimizer (momentum 0.9, weight decay 1e-4) at rate ``lr``."""
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM,
                           weight_decay=WEIGHT_DECAY)


def load(path: str) -> dict[str, torch.Tensor]:
    arrays = np.load(path)
    return {name: torch.from_numpy(arrays[name]) for name in ("x", "y", "x_val", "y_val")}


def my_rows(rows: torch.Tensor, micro: int, micro_batch: int) -> torch.Tensor:
    """This rank's ``micro``-th micro-batch of one optimizer step's global batch."""
    start = (micro * hvt.size() + hvt.rank()) * micro_batch
    return rows[start:start + micro_batch]


def constant_warmup_lr(no_warmup: LinearScalingSchedule, step: int) -> float:
    """η for the first WARMUP_EPOCHS epochs, then the no-warmup schedule (kη, decayed)."""
    if step < WARMUP_EPOCHS * no_warmup.steps_per_epoch:
        return no_warmup.base_lr
    return no_warmup.lr_at(step)


def train(run: dict, spec: dict, data: dict[str, torch.Tensor]) -> list[dict]:
    """One result per seed of ``run``: the copies train side by side, each on its own
    seed's order of the data."""
    x, y = data["x"].float(), data["y"]
    seeds, micro_batch, passes = run["seeds"], run["micro_batch"], run["passes"]
    global_batch = micro_batch * passes * hvt.size()
    steps_per_epoch = len(x) // global_batch
    started = time.monotonic()
    model = make_model(seeds, bn_group=run.get("bn_group"))
    optimizer = hvt.DistributedOptimizer(
        sgd(model, run["eta"]),
        model.named_parameters(), backward_passes_per_step=passes,
        average_aggregated_gradients=True)
    scheduler = hvt.LinearScalingWarmup(
        optimizer, batch_size_per_worker=micro_batch, steps_per_epoch=steps_per_epoch,
        base_batch_size=spec["base_batch"], milestones=spec["milestones"], gamma=GAMMA,
        warmup_epochs=WARMUP_EPOCHS if run["warmup"] == "gradual" else 0,
        backward_passes_per_step=passes)
    hvt.broadcast_state(model, optimizer, scheduler)
    no_warmup = scheduler.schedule_for(run["eta"])
    losses, errors = [], []
    for epoch in range(spec["epochs"]):
        orders = torch.stack([torch.randperm(len(x), generator=torch.Generator().manual_seed(
            seed * 1000 + epoch)) for seed in seeds], dim=1)  # (examples, copies)
        loss_sum = wrong = torch.zeros(len(seeds), dtype=torch.float64)
        for batch in range(steps_per_epoch):
            rows = orders[batch * global_batch:(batch + 1) * global_batch]
            if run["warmup"] == "constant":
                for group in optimizer.param_groups:
                    group["lr"] = constant_warmup_lr(no_warmup, epoch * steps_per_epoch + batch)
            optimizer.zero_grad()
            for micro in range(passes):
                mine = my_rows(rows, micro, micro_batch)
                logits = model(x[mine])
                each = copy_losses(logits, y[mine])
                each.sum().backward()
                loss_sum = loss_sum + each.detach()
                wrong = wrong + (logits.argmax(dim=2) != y[mine]).sum(dim=0)
            optimizer.step()
            scheduler.step()
        # Every rank trains on as many examples, so the plain mean over ranks is exact.
        examples = steps_per_epoch * passes * micro_batch
        epoch_metrics = hvt.average_metrics(
            {**{f"loss{i}": float(v) / (steps_per_epoch * passes) for i, v in enumerate(loss_sum)},
             **{f"error{i}": float(v) / examples for i, v in enumerate(wrong)}})
        losses.append([epoch_metrics[f"loss{i}"] for i in range(len(seeds))])
        errors.append([epoch_metrics[f"error{i}"] for i in range(len(seeds))])
    with torch.no_grad():
        for buffer in model.buffers():  # BN's running statistics: the mean over workers
            if buffer.is_floating_point():
                hvt.allreduce_(buffer, op=hvt.Average, name="goyal.bn_statistics")
        model.eval()
        x_val = data["x_val"].float()
        predictions = model(x_val.unsqueeze(1).expand(-1, len(seeds), -1)).argmax(dim=2)
        val_errors = (predictions != data["y_val"].unsqueeze(1)).double().mean(dim=0)
    seconds = time.monotonic() - started
    common = {key: value for key, value in run.items() if key != "seeds"}
    return [{**common, "seed": seed, "global_batch": global_batch,
             "steps_per_epoch": steps_per_epoch, "target_lr": no_warmup.target_lr,
             "val_error": float(val_errors[i]), "train_loss": [epoch[i] for epoch in losses],
             "train_error": [epoch[i] for epoch in errors],
             "seconds": seconds / len(seeds), "trained_with_seeds": len(seeds)}
            for i, seed in enumerate(seeds)]


def verify_accumulation(check: dict, data: dict[str, torch.Tensor]) -> dict:
    """The largest parameter difference, per dtype, between 2 ranks x ``passes`` backward
    passes per step through hvdtrain and one process on the concatenated batch (two
    copies side by side, each on its own order of the rows, as the benchmark trains its
    seeds)."""
    micro_batch, passes, steps = check["micro_batch"], check["passes"], check["steps"]
    global_batch = micro_batch * passes * hvt.size()
    differences = {}
    for dtype in (torch.float64, torch.float32):
        x, y = data["x"].to(dtype), data["y"]
        model = make_model((7, 8), dtype, check.get("bn_group"))
        reference = make_model((7, 8), dtype, check.get("bn_group"))
        optimizer = hvt.DistributedOptimizer(
            sgd(model, 0.05),
            model.named_parameters(), backward_passes_per_step=passes,
            average_aggregated_gradients=True)
        plain = sgd(reference, 0.05)
        for step in range(steps):
            first = torch.arange(step * global_batch, (step + 1) * global_batch)
            rows = torch.stack([first, first.flip(0)], dim=1)  # copy 2: other BN groups
            optimizer.zero_grad()
            for micro in range(passes):
                mine = my_rows(rows, micro, micro_batch)
                copy_losses(model(x[mine]), y[mine]).sum().backward()
            optimizer.step()
            plain.zero_grad()
            copy_losses(reference(x[rows]), y[rows]).sum().backward()
            plain.step()
        with torch.no_grad():
            differences[str(dtype).removeprefix("torch.")] = max(
                float((mine - theirs).abs().max())
                for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True))
    return {**check, "workers": hvt.size(), "global_batch": global_batch,
            "max_abs_parameter_difference": differences}


def main() -> None:
    with open(sys.argv[1]) as file:
        spec = json.load(file)
    torch.set_num_threads(1)
    hvt.init()
    data = load(spec["data"])
    verified = [verify_accumulation(check, data) for check in spec.get("verify") or []]
    results = [result for run in spec["runs"] for result in train(run, spec, data)]
    if hvt.rank() == 0:
        print("RESULT " + json.dumps({"workers": hvt.size(), "verify": verified,
                                      "runs": results}), flush=True)


if __name__ == "__main__":
    main()

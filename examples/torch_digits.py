"""Train a small classifier on scikit-learn's handwritten digits with 2+ Horovod workers.

Run:  horovodrun -np 2 --gloo python examples/torch_digits.py

Each worker trains on its own shard of every epoch's shuffled batch; gradients are
averaged with Horovod's allreduce; the learning rate follows Goyal et al.'s linear
scaling rule with gradual warmup (hvdtrain.schedule). Only rank 0 prints.

This is the plain-Horovod version of the job; the data never leaves the machine
(the digits ship inside scikit-learn).
"""

from __future__ import annotations

import argparse

import horovod.torch as hvd
import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from hvdtrain.schedule import LinearScalingSchedule


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size-per-worker", type=int, default=32)
    parser.add_argument("--base-lr", type=float, default=0.05,
                        help="learning rate tuned for --base-batch-size")
    parser.add_argument("--base-batch-size", type=int, default=32)
    parser.add_argument("--warmup-epochs", type=float, default=2)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def load_data(seed: int) -> tuple[torch.Tensor, ...]:
    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        features, digits.target, test_size=0.2, random_state=seed, stratify=digits.target
    )
    return (torch.from_numpy(x_train), torch.from_numpy(y_train),
            torch.from_numpy(x_test), torch.from_numpy(y_test))


def mean_over_workers(value: float, name: str) -> float:
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed + hvd.rank())  # different on purpose: the broadcast fixes it
    x_train, y_train, x_test, y_test = load_data(args.seed)

    global_batch = args.batch_size_per_worker * hvd.size()
    steps_per_epoch = len(x_train) // global_batch
    schedule = LinearScalingSchedule(
        base_lr=args.base_lr, batch_size_per_worker=args.batch_size_per_worker,
        workers=hvd.size(), steps_per_epoch=steps_per_epoch,
        base_batch_size=args.base_batch_size, warmup_epochs=args.warmup_epochs,
    )

    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=schedule.lr_at(0), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    if hvd.rank() == 0:
        print(f"{hvd.size()} workers, global batch {global_batch}, {steps_per_epoch} steps/epoch, "
              f"LR {schedule.base_lr:g} -> {schedule.target_lr:g} over "
              f"{schedule.warmup_steps} warmup steps", flush=True)

    step = 0
    for epoch in range(args.epochs):
        model.train()
        # Same permutation on every rank (same seed); each takes its own slice of a batch.
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        total_loss = 0.0
        for batch in range(steps_per_epoch):
            start = batch * global_batch + hvd.rank() * args.batch_size_per_worker
            index = order[start:start + args.batch_size_per_worker]
            for group in optimizer.param_groups:
                group["lr"] = schedule.lr_at(step)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x_train[index]), y_train[index])
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
            step += 1

        model.eval()
        with torch.no_grad():
            shard = slice(hvd.rank(), None, hvd.size())
            correct = (model(x_test[shard]).argmax(1) == y_test[shard]).sum().item()
        train_loss = mean_over_workers(total_loss / steps_per_epoch, "train_loss")
        accuracy = hvd.allreduce(torch.tensor(float(correct)), op=hvd.Sum,
                                 name="correct").item() / len(x_test)
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1:>2}/{args.epochs}  lr {schedule.lr_at(step - 1):.4f}  "
                  f"train loss {train_loss:.4f}  test accuracy {accuracy:.4f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

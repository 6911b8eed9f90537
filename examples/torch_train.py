"""Data-parallel training of a digit classifier with hvdtrain's PyTorch adapter.

Run:   horovodrun -np 2 --mpi python examples/torch_train.py
Then:  horovodrun -np 2 --mpi python examples/torch_train.py --epochs 20 --resume

Each worker trains on its share of every epoch's shuffle of scikit-learn's
handwritten digits (shipped inside scikit-learn; nothing is downloaded). Gradients
are averaged by DistributedOptimizer; the learning rate follows Goyal et al.'s linear
scaling rule with gradual warmup; rank 0's initial state is broadcast to everyone; a
checkpoint is written atomically after every epoch and ``--resume`` continues from
it; the replicas are checked for divergence every epoch. Only rank 0 prints.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvdtrain.adapters.torch as hvt
from hvdtrain.runtime import under_launcher


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size-per-worker", type=int, default=32)
    parser.add_argument("--base-lr", type=float, default=0.05,
                        help="learning rate tuned for --base-batch-size (eta)")
    parser.add_argument("--base-batch-size", type=int, default=32)
    parser.add_argument("--warmup-epochs", type=float, default=2)
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoints/torch_train.pt"))
    parser.add_argument("--resume", action="store_true",
                        help="continue from --checkpoint (epoch, weights, optimizer, schedule)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def digits(seed: int) -> tuple[torch.utils.data.TensorDataset, torch.Tensor, torch.Tensor]:
    data = load_digits()
    features = (data.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        features, data.target, test_size=0.2, random_state=seed, stratify=data.target
    )
    train = torch.utils.data.TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    return train, torch.from_numpy(x_test), torch.from_numpy(y_test)


def say(line: str) -> None:
    """Print ``line`` in one write: launchers forward (and mpirun tags) each write a rank
    makes, so a print's text and its newline, written apart, can end up on two lines."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Progress:
    """Rank 0's progress through an epoch, on stdout with the epoch lines (so that the two
    never interleave out of order): redrawn in place on a terminal; in quarters, one
    line each, under a launcher, which forwards and tags every line a rank prints."""

    def __init__(self, label: str, total: int, enabled: bool) -> None:
        self.label, self.total, self.enabled = label, total, enabled
        self.in_place = enabled and sys.stdout.isatty() and not under_launcher()
        self.next_quarter = 1

    def update(self, done: int, loss: float) -> None:
        if not self.enabled:
            return
        if self.in_place:
            filled = 30 * done // self.total
            bar = "#" * filled + "." * (30 - filled)
            end = "\r" if done < self.total else "\r" + " " * 80 + "\r"
            sys.stdout.write(f"{self.label} [{bar}] {done}/{self.total} loss {loss:.4f}{end}")
            sys.stdout.flush()
        elif done * 4 >= self.next_quarter * self.total and done < self.total:
            say(f"{self.label} {25 * self.next_quarter}% ({done}/{self.total} batches) "
                f"loss {loss:.4f}")
            self.next_quarter += 1


def evaluate(model: torch.nn.Module, x_test: torch.Tensor, y_test: torch.Tensor) -> float:
    """Accuracy on the whole test set, each rank scoring its own slice."""
    model.eval()
    shard = slice(hvt.rank(), None, hvt.size())
    with torch.no_grad():
        correct = (model(x_test[shard]).argmax(1) == y_test[shard]).sum()
    counts = torch.tensor([float(correct), float(len(y_test[shard]))], dtype=torch.float64)
    total_correct, total = hvt.allreduce(counts, op=hvt.Sum, name="test_accuracy").tolist()
    return total_correct / total


def main(argv: list[str] | None = None) -> int:
    """Train with the command-line options ``argv`` (default: this process's)."""
    args = parse_args(argv)
    hvt.init()
    is_root = hvt.rank() == 0
    torch.manual_seed(args.seed + hvt.rank())  # differs per rank: broadcast_state fixes that
    train_set, x_test, y_test = digits(args.seed)
    sampler = hvt.distributed_sampler(train_set, seed=args.seed)
    loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size_per_worker,
                                         sampler=sampler, drop_last=True)

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    optimizer = hvt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.base_lr, momentum=0.9),
        model.named_parameters(),
    )
    scheduler = hvt.LinearScalingWarmup(
        optimizer, batch_size_per_worker=args.batch_size_per_worker,
        steps_per_epoch=len(loader), base_batch_size=args.base_batch_size,
        warmup_epochs=args.warmup_epochs,
    )
    start_epoch = 0
    if args.resume:
        try:
            extra = hvt.load_checkpoint(args.checkpoint, model, optimizer, scheduler)
        except RuntimeError as error:
            print(f"cannot resume: {error}", file=sys.stderr)
            return 1
        start_epoch = extra["epoch"]
    else:
        hvt.broadcast_state(model, optimizer, scheduler)
    if is_root:
        plan = scheduler.schedule_for(args.base_lr)
        say(f"{hvt.size()} workers, global batch {plan.global_batch_size} (k={plan.scale:g}), "
            f"{len(loader)} steps/epoch, LR {plan.base_lr:g} -> {plan.target_lr:g} over "
            f"{plan.warmup_steps} warmup steps"
            + (f"; resuming after epoch {start_epoch}" if start_epoch else ""))
        args.checkpoint.parent.mkdir(parents=True, exist_ok=True)

    for epoch in range(start_epoch, args.epochs):
        started = time.monotonic()
        model.train()
        sampler.set_epoch(epoch)
        progress = Progress(f"epoch {epoch + 1}/{args.epochs}", len(loader), enabled=is_root)
        total_loss = 0.0
        for batch, (x, y) in enumerate(loader, start=1):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total_loss += loss.item()
            progress.update(batch, total_loss / batch)
        train_loss = hvt.average_metrics({"loss": total_loss / len(loader)})["loss"]
        accuracy = evaluate(model, x_test, y_test)
        hvt.verify_replicas(model, optimizer)
        hvt.save_checkpoint(args.checkpoint, model, optimizer, scheduler, epoch=epoch + 1)
        if is_root:
            say(f"epoch {epoch + 1:>2}/{args.epochs}  lr {scheduler.get_last_lr()[0]:.4f}  "
                f"train loss {train_loss:.4f}  test accuracy {accuracy:.4f}  "
                f"({time.monotonic() - started:.1f} s, replicas identical)")
    if is_root:
        say(f"final state fingerprint {hvt.state_fingerprint(model, optimizer)}; "
            f"checkpoint {args.checkpoint}")
    hvt.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

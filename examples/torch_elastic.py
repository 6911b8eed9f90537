"""Elastic data-parallel training with hvdtrain's PyTorch adapter: workers may leave or
join mid-training, and the learning rate follows the linear scaling rule for however
many remain.

Demo:  python examples/torch_elastic.py --demo
       (starts a 3-worker elastic job on this machine, kills one worker mid-training,
       finishes on 2; the last line reads
       ``workers 3 -> 2 at step S, lr X -> Y, replicas identical, done``)
Run:   horovodrun --gloo -np 3 --min-np 2 --max-np 4 \\
           --host-discovery-script ./discover.sh python examples/torch_elastic.py

The digit classifier of examples/torch_train.py, trained inside ``hvt.elastic.run``:
the model, optimizer, warmup scheduler, sampler position and epoch live in an
``hvt.elastic.TorchState`` committed every few steps. When a worker is lost the others
roll back to the last commit, re-form without it, and go on; the scheduler continues
the rule for the new k from the samples seen, and the sampler shares what is left of
the epoch among the workers that remain. Only rank 0 prints.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys

import numpy as np
import torch
from sklearn.datasets import load_digits

import hvdtrain.adapters.torch as hvt
from hvdtrain.jobs.local_hosts import run_elastic_demo

SUMMARY = re.compile(r"workers \d+ -> \d+ at step \d+, lr .* done$")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", action="store_true",
                        help="start a 3-worker elastic job here and kill one worker in it")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size-per-worker", type=int, default=32)
    parser.add_argument("--base-lr", type=float, default=0.05,
                        help="learning rate tuned for --base-batch-size (eta)")
    parser.add_argument("--base-batch-size", type=int, default=32)
    parser.add_argument("--warmup-epochs", type=float, default=2)
    parser.add_argument("--commit-every", type=int, default=5, help="steps between commits")
    parser.add_argument("--kill-rank-at-step", type=int, nargs=2, metavar=("RANK", "STEP"),
                        help="(the demo) this rank kills itself before this step")
    return parser.parse_args()


def say(line: str) -> None:
    """One write per line: the launcher forwards each write separately."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def train(args: argparse.Namespace) -> None:
    hvt.init()
    torch.manual_seed(hvt.rank())  # differs per rank: the state's first sync fixes that
    data = load_digits()
    features = torch.from_numpy((data.data / 16.0).astype(np.float32))
    dataset = torch.utils.data.TensorDataset(features, torch.from_numpy(data.target))
    sampler = hvt.elastic.ElasticSampler(dataset, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size_per_worker,
                                         sampler=sampler)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    optimizer = hvt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.base_lr, momentum=0.9),
        model.named_parameters())
    scheduler = hvt.LinearScalingWarmup(
        optimizer, batch_size_per_worker=args.batch_size_per_worker,
        steps_per_epoch=len(loader), base_batch_size=args.base_batch_size,
        warmup_epochs=args.warmup_epochs)
    state = hvt.elastic.TorchState(model, optimizer, warmup=scheduler, sampler=sampler,
                                   epoch=0, step=0)
    changes: list[str] = []  # rank 0's record of each change of the number of workers
    last = {"size": hvt.size(), "lr": optimizer.param_groups[0]["lr"]}

    @hvt.elastic.run
    def epochs(state: hvt.elastic.TorchState) -> None:
        while state.epoch < args.epochs:
            losses = []
            for batch, (x, y) in enumerate(loader):
                if args.kill_rank_at_step == [hvt.rank(), state.step]:
                    os.kill(os.getpid(), signal.SIGKILL)  # the demo's lost worker
                lr = optimizer.param_groups[0]["lr"]
                if hvt.size() != last["size"]:
                    changes.append(f"workers {last['size']} -> {hvt.size()} at step "
                                   f"{state.step}, lr {last['lr']:.4g} -> {lr:.4g}")
                    if hvt.rank() == 0:
                        say(f"{changes[-1]}: rolled back to the last commit, going on")
                last.update(size=hvt.size(), lr=lr)
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                scheduler.step()
                sampler.record_batch(batch, args.batch_size_per_worker)
                losses.append(loss.item())
                state.step += 1
                if state.step % args.commit_every == 0:
                    state.commit()
            mean_loss = hvt.average_metrics({"loss": sum(losses) / max(len(losses), 1)})
            if hvt.rank() == 0:
                say(f"epoch {state.epoch + 1}/{args.epochs}  workers {hvt.size()}  "
                    f"lr {optimizer.param_groups[0]['lr']:.4f}  loss {mean_loss['loss']:.4f}")
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()

    epochs(state)
    hvt.verify_replicas(model)
    if hvt.rank() == 0:
        say(f"{'; '.join(changes) or f'workers {hvt.size()} throughout'}, "
            "replicas identical, done")


def demo(args: argparse.Namespace) -> int:
    """Run this script as a 3-worker elastic job on this machine, one host name per
    worker, whose rank 2 kills itself at step 17 (two steps after a commit)."""
    say("starting 3 workers (host-a, host-b, host-c on this machine); rank 2 will be "
        "killed at step 17")
    return run_elastic_demo(
        [sys.executable, __file__, "--epochs", str(args.epochs), "--kill-rank-at-step", "2", "17"],
        ["host-a", "host-b", "host-c"], min_np=2, summary=SUMMARY, say=say)


def main() -> int:
    args = parse_args()
    if args.demo:
        return demo(args)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

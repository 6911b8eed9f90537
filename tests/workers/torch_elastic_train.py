"""An elastic job with hvdtrain's TorchState: ``python torch_elastic_train.py MODE HOSTS``
(HOSTS: the folder of hvdtrain.jobs.local_hosts.LocalHosts the job was started with).

Every worker trains a float64 linear model on 240 numbered samples (batch 4 per
worker) with DistributedOptimizer, LinearScalingWarmup (η = 0.05 for a batch of 4,
2 warmup epochs) and an ElasticSampler, for 2 epochs, committing every 4 steps and
at each epoch's end. MODE:

- ``shrink``: starts on 3 workers; at step 14 (two steps after a commit, mid-epoch)
  the worker of rank 2 kills itself with SIGKILL. The others roll back to step 12
  and go on as 2.
- ``lose-rank-0``: the same, but rank 0 kills itself; the others go on as 2.
- ``below-min``: the same as ``shrink``, launched with ``--min-np 3``: the job must end.
- ``lose-two``: starts on 5 workers; at step 10 (two steps after a commit, two thirds
  into the first epoch) ranks 3 and 4 kill themselves. The others go on as 3.
- ``grow``: starts on 2 workers; after the commit of step 8, rank 0 offers a third
  host through HOSTS; the job goes on as 3.

With ``HVDTRAIN_TEST_SHARDED=1`` the optimizer is SGD with momentum 0.9 and
``shard_state=True`` (``HVDTRAIN_TEST_SHARDED=gradients``: ``shard_gradients=True``), so
each reset re-shards a state that matters; the reports then carry what one process
needs to replay the steps that stand (rank 0's initial weights, each step's samples,
the final weights).

Each worker prints ``REPORT {json}`` lines: ``started`` (its pid and host name),
``step`` (rank, size, step, epoch and the
learning rate the step used), ``commit`` (the (epoch, sample) pairs this rank
consumed since the previous commit, the scheduler's samples_seen), ``killed`` (the victim, with the
time) and ``done`` (weights' fingerprint, after ``verify_replicas``).
"""

import os
import signal
import socket
import sys
import time
from pathlib import Path

import torch
from scenarios import report as report_for_rank
from torch_common import numbered_problem

import hvdtrain.adapters.torch as hvt
from hvdtrain.adapters.torch import elastic
from hvdtrain.jobs.local_hosts import LocalHosts

SAMPLES, BATCH, EPOCHS, COMMIT_EVERY = 240, 4, 2, 4
GROW_AFTER = 8
# By mode: the job's size when the victims kill themselves, the step, the victims' ranks.
KILLS = {"shrink": (3, 14, (2,)), "lose-rank-0": (3, 14, (0,)), "below-min": (3, 14, (2,)),
         "lose-two": (5, 10, (3, 4))}
SHARDING = {"1": {"shard_state": True}, "gradients": {"shard_gradients": True}}.get(
    os.environ.get("HVDTRAIN_TEST_SHARDED", ""), {})
SHARDED = bool(SHARDING)


def report(scenario: str, **values) -> None:
    report_for_rank(hvt.rank(), scenario, size=hvt.size(), **values)


class Numbered(torch.utils.data.Dataset):
    """Sample i: (i, x_i, y_i) of a fixed linear problem, so that a report can say
    which samples a step consumed."""

    def __init__(self) -> None:
        self.x, self.y = numbered_problem(SAMPLES)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int):
        return index, self.x[index], self.y[index]


def main(mode: str, hosts: LocalHosts | None) -> None:
    """Train in ``mode``; ``hosts`` (needed by ``grow`` only) is the job's LocalHosts."""
    killed_size, kill_at, victims = KILLS.get(mode, (0, -1, ()))
    hvt.init()
    report("started", pid=os.getpid(), host=socket.gethostname())
    torch.set_num_threads(1)
    torch.manual_seed(100 + hvt.rank())  # different until the state's first sync
    dataset = Numbered()
    sampler = elastic.ElasticSampler(dataset, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    model = torch.nn.Linear(4, 1).double()
    if SHARDED and hvt.rank() == 0:
        report("initial", weights=weights(model))
    optimizer = hvt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9 if SHARDED else 0.0),
        model.named_parameters(), **SHARDING)
    scheduler = hvt.LinearScalingWarmup(
        optimizer, batch_size_per_worker=BATCH, base_batch_size=BATCH, warmup_epochs=2,
        steps_per_epoch=SAMPLES // (BATCH * hvt.size()))
    state = elastic.TorchState(model, optimizer, warmup=scheduler, sampler=sampler,
                               epoch=0, step=0)
    consumed: list[tuple[int, int]] = []  # this rank's (epoch, sample) since the last commit

    def commit() -> None:
        # state.commit() is these two calls; the report goes between them, because the
        # second raises when hosts were added, after the state is saved.
        state.save()
        report("commit", step=state.step, epoch=state.epoch, samples=consumed,
               samples_seen=scheduler.samples_seen, fingerprint=hvt.state_fingerprint(model))
        consumed.clear()
        state.check_host_updates()

    @elastic.run
    def train(state) -> None:
        consumed.clear()  # what was consumed since the last commit was rolled back
        while state.epoch < EPOCHS:
            for batch, (index, x, y) in enumerate(loader):
                if (state.step == kill_at and hvt.rank() in victims
                        and hvt.size() == killed_size):
                    report("killed", step=state.step, time=time.time())
                    os.kill(os.getpid(), signal.SIGKILL)
                lr = optimizer.param_groups[0]["lr"]
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x).squeeze(1), y).backward()
                optimizer.step()
                scheduler.step()
                sampler.record_batch(batch, BATCH)
                consumed.extend((state.epoch, i) for i in index.tolist())
                state.step += 1
                report("step", step=state.step - 1, epoch=state.epoch, lr=lr,
                       time=time.time(), samples=index.tolist())
                if state.step % COMMIT_EVERY == 0:
                    commit()
                    if (mode == "grow" and state.step == GROW_AFTER and hvt.rank() == 0
                            and hvt.size() == 2):
                        hosts.set(["host-a", "host-b", "host-c"])
                time.sleep(0.05)  # leave the driver time to notice a new host
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            commit()

    train(state)
    hvt.verify_replicas(model)
    report("done", fingerprint=hvt.state_fingerprint(model), steps=state.step,
           gloo_timeout=os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS"), weights=weights(model))


def weights(model: torch.nn.Module) -> dict:
    return {name: p.detach().tolist() for name, p in model.named_parameters()}


if __name__ == "__main__":
    main(sys.argv[1], LocalHosts(Path(sys.argv[2])))

"""Runs on each of 2 ranks: DistributedOptimizer restricted to a Horovod process set.

``python torch_process_sets.py OUTDIR``. The process set holds rank 0 only: rank 0
averages over itself, and rank 1, outside the set, trains on its own gradients
(Horovod's meaning of ``process_set``). Each rank saves its weights as
OUTDIR/<scenario>-rank<r>.pt; tests/adapters/test_torch_horovod_api.py compares them
with one plain-PyTorch process on that rank's rows. ``process_set_sharded`` does the same
with ``shard_state=True`` (rank 0 holds the whole state as the set's one member).
"""

import functools
import sys
from pathlib import Path

import torch
from scenarios import report, run_scenarios
from torch_common import STEPS, loss_fn, make_data, make_model, make_optimizer, rows

import hvdtrain.adapters.torch as hvt

OUT = Path(sys.argv[1])
RANK_ZERO_ONLY = hvt.ProcessSet([0])


def scenario_process_set(name: str, **settings) -> None:
    x, y = make_data()
    model = make_model()
    optimizer = hvt.DistributedOptimizer(make_optimizer("sgd", model.parameters()),
                                         model.named_parameters(), skip_nonfinite=True,
                                         process_set=RANK_ZERO_ONLY, **settings)
    for step in range(STEPS):
        optimizer.zero_grad()
        part = rows(step, 0, hvt.rank(), 1)
        loss_fn(model, x[part], y[part]).backward()
        optimizer.step()
    torch.save({name: p.detach().clone() for name, p in model.named_parameters()},
               OUT / f"{name}-rank{hvt.rank()}.pt")
    report(hvt.rank(), name, included=RANK_ZERO_ONLY.included(),
           skipped=optimizer.skipped_steps)
    hvt.barrier()  # rank 1 needs no collective above; it must not shut Horovod down early


def main() -> None:
    hvt.init(process_sets=[RANK_ZERO_ONLY])
    torch.set_num_threads(1)
    run_scenarios(hvt.rank, {
        "process_set": functools.partial(scenario_process_set, "process_set"),
        "process_set_sharded": functools.partial(scenario_process_set, "process_set_sharded",
                                                 shard_state=True),
    })
    hvt.shutdown()


if __name__ == "__main__":
    main()

"""Runs on each of 2 ranks (MPI): the checks of hvdtrain.adapters.numpy in one launch.

``python numpy_adapter.py OUTDIR``: prints ``REPORT {json}`` lines and saves arrays as
OUTDIR/<name>-rank<r>.npz for tests/adapters/test_numpy.py.
"""

import json
import sys
from pathlib import Path

import numpy as np
from numpy_common import STEPS, gradients, make_data, make_weights, rows
from scenarios import EventRecorder, exercise_tensor_collective

import hvdtrain.adapters.numpy as hvn
from hvdtrain.step_events import step_observers

OUT = Path(sys.argv[1])


def report(scenario: str, **values) -> None:
    print("REPORT " + json.dumps({"scenario": scenario, "rank": hvn.rank(), **values}),
          flush=True)


def rank_values(rank: int, dtype, shape) -> np.ndarray:
    count = int(np.prod(shape))
    return (np.arange(count) * (rank + 1) + 3 * rank).astype(dtype).reshape(shape)


def scenario_collectives() -> None:
    results = {}
    for label, dtype, shape in [("float32", np.float32, (3, 4)), ("float64", np.float64, (5,)),
                                ("int32", np.int32, (2, 3)), ("empty", np.float64, (0, 3))]:
        mine = rank_values(hvn.rank(), dtype, shape)
        results[f"{label}_mean"] = hvn.allreduce_mean(mine)
        results[f"{label}_broadcast"] = hvn.broadcast(mine if hvn.rank() == 0 else None)
    base = np.arange(24, dtype=np.float64).reshape(4, 6) * (hvn.rank() + 1)
    results["strided_mean"] = hvn.allreduce_mean(base[:, ::2].T)
    results["strided_broadcast"] = hvn.broadcast(base[::2, 1::2].T)
    np.savez(OUT / f"collectives-rank{hvn.rank()}.npz", **results)

    big = np.full(8 * 1024 * 1024, hvn.rank() + 1.0)  # 64 MB of float64
    big_mean = hvn.allreduce_mean(big)
    big_root = hvn.broadcast(big * 2)
    report("large", nbytes=big.nbytes, mean_min=float(big_mean.min()),
           mean_max=float(big_mean.max()), broadcast_unique=np.unique(big_root).tolist())

    try:
        hvn.allreduce_mean(np.zeros(3 if hvn.rank() == 0 else 4))
        mismatch = None
    except ValueError as error:
        mismatch = str(error)
    try:
        hvn.DistributedSGD([np.zeros(3 if hvn.rank() == 0 else 4)], lr=0.1)
        model_mismatch = None
    except ValueError as error:
        model_mismatch = str(error)
    report("mismatch", message=mismatch, model_message=model_mismatch)


def scenario_sgd() -> None:
    x, y = make_data()
    weights = make_weights(seed=123 if hvn.rank() == 0 else 999)
    hvn.broadcast_in_place(weights)
    optimizer = hvn.DistributedSGD(weights, lr=0.1, momentum=0.9)
    scheduler = hvn.LinearScalingWarmup(optimizer, batch_size_per_worker=4, steps_per_epoch=5,
                                        base_batch_size=4, warmup_epochs=2)
    lrs, events = [], []
    stop_observing = step_observers.add(EventRecorder(events))
    for step in range(STEPS):
        lrs.append(optimizer.lr)
        part = rows(step, hvn.rank())
        optimizer.step(gradients(weights, x[part], y[part]))
        scheduler.step()
    stop_observing()
    hvn.verify_replicas(weights)
    np.savez(OUT / f"sgd-rank{hvn.rank()}.npz", *weights)
    report("sgd", lrs=lrs, events=events)

    if hvn.rank() == 1:
        weights[1][0] += 1e-15
    try:
        hvn.verify_replicas(weights)
        message = None
    except hvn.ReplicaMismatchError as error:
        message = str(error)
    report("verify", message=message)


def main() -> None:
    hvn.init()
    scenario_collectives()
    scenario_sgd()
    report("tensor_collective", **exercise_tensor_collective(
        hvn.tensors(), hvn.rank(), np.asarray, lambda a: a.tolist()))


if __name__ == "__main__":
    main()

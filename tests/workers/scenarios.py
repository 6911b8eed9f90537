"""What every multi-scenario worker script shares: reporting, and running its scenarios so
that a failing one is reported under its own name instead of ending the launch.

A scenario that raises prints ``REPORT {"scenario": name, "rank": r, "failed": traceback}``
and the next scenario runs; tests/harness.py's ``Run`` turns that into a test failure
naming the scenario. (A failure on one rank only can leave the other rank waiting in the
next scenario's collective; the watchdog then ends the launch, and the scenarios that
did report are still judged.)
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable

ONLY = "HVDTRAIN_TEST_SCENARIOS"


REPORTS_FILE = "HVDTRAIN_TEST_REPORTS"


def report(rank: int, scenario: str, **values) -> None:
    """Print one ``REPORT {json}`` line for ``scenario`` on ``rank``; with
    ``HVDTRAIN_TEST_REPORTS=FILE`` also append it to FILE (where stdout does not reach
    the test, as on Ray)."""
    line = "REPORT " + json.dumps({"scenario": scenario, "rank": rank, **values})
    print(line, flush=True)
    if os.environ.get(REPORTS_FILE):
        with open(os.environ[REPORTS_FILE], "a") as file:  # one write, appended whole
            file.write(line + "\n")


def run_scenarios(rank: Callable[[], int], scenarios: dict[str, Callable[[], None]]) -> None:
    """Run each scenario in order; report a failing one with its traceback and go on.

    With ``HVDTRAIN_TEST_SCENARIOS=a,b`` in the environment only those run (a name that is
    not a scenario is an error), in this order.
    """
    chosen = [name for name in os.environ.get(ONLY, "").split(",") if name]
    unknown = set(chosen) - set(scenarios)
    if unknown:
        raise ValueError(f"{ONLY} names no scenario {sorted(unknown)}; there are {list(scenarios)}")
    for name, scenario in scenarios.items():
        if chosen and name not in chosen:
            continue
        try:
            scenario()
        except Exception:
            report(rank(), name, failed=traceback.format_exc())


class EventRecorder:
    """A step observer (hvdtrain.step_events.StepObserver) appending what it hears."""

    def __init__(self, events):
        self.events = events

    def reduction_started(self, step):
        self.events.append(["reduction_started", step])

    def reduction_finished(self, step):
        self.events.append(["reduction_finished", step])

    def step_finished(self, step, applied):
        self.events.append(["step_finished", step, applied])


def exercise_tensor_collective(workers, rank: int, to_tensor, to_list) -> dict:
    """Each operation of an adapter's ``tensors()`` (the core's TensorCollective) on
    this rank's own values, (rank + 1) times a (size, 4) range; the tests compare the
    results with :func:`expected_tensor_collective`. ``to_tensor`` makes the adapter's
    tensor of a NumPy array, ``to_list`` reads one back."""
    import numpy as np

    size = workers.size()
    base = np.arange(4 * size, dtype=np.float32).reshape(size, 4)

    def mine():
        return to_tensor(base * (rank + 1))

    def done(handle):
        return to_list(workers.wait(handle))

    return {
        "size": size,
        "sum": done(workers.allreduce(mine(), "hvdtrain.test.sum")),
        "average_scaled": done(workers.allreduce(mine(), "hvdtrain.test.average", op="average",
                                                 prescale=2.0, postscale=0.5)),
        "min": done(workers.allreduce(mine(), "hvdtrain.test.min", op="min")),
        "max": done(workers.allreduce(mine(), "hvdtrain.test.max", op="max")),
        "reduce_scatter": np.asarray(done(workers.reduce_scatter(
            mine(), "hvdtrain.test.reduce_scatter", op="average"))).reshape(-1).tolist(),
        "allgather": done(workers.allgather(to_tensor(base[:1] * (rank + 1)),
                                            "hvdtrain.test.allgather")),
        "broadcast": done(workers.broadcast(mine(), size - 1, "hvdtrain.test.broadcast")),
    }


def expected_tensor_collective(size: int, rank: int) -> dict:
    """What :func:`exercise_tensor_collective` must give on ``rank`` of ``size``,
    computed here from the ranks' values."""
    import numpy as np

    base = np.arange(4 * size, dtype=np.float64).reshape(size, 4)
    values = [base * (r + 1) for r in range(size)]
    total = sum(values)
    return {
        "size": size,
        "sum": total.tolist(),
        "average_scaled": (total * 2.0 / size * 0.5).tolist(),
        "min": np.minimum.reduce(values).tolist(),
        "max": np.maximum.reduce(values).tolist(),
        "reduce_scatter": (total / size)[rank].reshape(-1).tolist(),
        "allgather": np.concatenate([v[:1] for v in values]).tolist(),
        "broadcast": values[size - 1].tolist(),
    }

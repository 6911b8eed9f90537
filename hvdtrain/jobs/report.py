"""``hvdtrain report run.jsonl``: the step timing's records (``HVDTRAIN_METRICS_FILE``)
as a table per rank, the run's straggler line, and optionally a plot over time."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from typing import Any

from hvdtrain.stragglers import TimingWindow, find_straggler, merge, straggler_line


def summary(records: Sequence[dict[str, Any]]) -> str:
    """The records' table: one row per rank (its host, compute, wait and reduction per
    step over every window, weighted by steps, and how many windows named it the
    straggler), under a line with the span, the world sizes and the throughput.

    Raises:
        ValueError: when there are no records.
    """
    if not records:
        raise ValueError("the file holds no records: training wrote none yet (the first "
                         "comes after HVDTRAIN_STRAGGLER_REPORT_SECONDS of training)")
    windows = [TimingWindow.from_record(record) for record in records]
    sizes = sorted({window.world_size for window in windows})
    run = merge(windows)
    named = [record["straggler"] for record in records]
    rates = [record["steps_per_second"] for record in records]
    samples = [record["samples_per_second"] for record in records
               if record.get("samples_per_second") is not None]
    lines = [
        f"{len(records)} windows over {run.seconds:.0f} s of training, {run.steps} steps, "
        f"world size {', '.join(map(str, sizes))}; median {statistics.median(rates):.1f} "
        "steps/s" + (f", {statistics.median(samples):.0f} samples/s" if samples else ""),
        f"communication {run.communication_s * 1e3:.1f} ms per step, step "
        f"{run.step_s * 1e3:.1f} ms",
        "",
        f"{'rank':>4}  {'host':<20} {'compute ms':>10} {'wait ms':>8} {'reduction ms':>12} "
        f"{'steps':>7}  straggler in",
    ]
    for times in run.ranks:
        lines.append(f"{times.rank:>4}  {times.host[:20]:<20} {times.compute_s * 1e3:>10.1f} "
                     f"{run.wait_s(times) * 1e3:>8.1f} {times.reduction_s * 1e3:>12.1f} "
                     f"{times.steps:>7}  {named.count(times.rank)} of {len(records)} windows")
    straggler = find_straggler(run)
    lines += ["", straggler_line(straggler, ", over the whole file") if straggler else
              "hvdtrain: no straggler over the whole file (every rank within "
              "the report's threshold of the others' median compute)"]
    return "\n".join(lines)


def plot_step_times(records: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Draw each rank's compute and wait per step over time into the image ``path``."""
    from hvdtrain.jobs.plot import pyplot

    plt = pyplot()
    start = records[0]["time"] - records[0]["seconds"]
    figure, (compute, wait) = plt.subplots(2, 1, sharex=True, figsize=(8, 6))
    ranks = sorted({entry["rank"] for record in records for entry in record["ranks"]})
    for rank in ranks:
        points = [(record["time"] - start, entry) for record in records
                  for entry in record["ranks"] if entry["rank"] == rank]
        seconds = [t for t, _ in points]
        compute.plot(seconds, [e["compute_ms"] for _, e in points], marker=".",
                     label=f"rank {rank}")
        wait.plot(seconds, [e["wait_ms"] for _, e in points], marker=".")
    compute.set_ylabel("compute per step (ms)")
    wait.set_ylabel("wait per step (ms)")
    wait.set_xlabel("seconds since the first window began")
    compute.legend(fontsize="small", ncol=min(len(ranks), 4))
    compute.set_title("where each rank's step goes (hvdtrain step timing)")
    for axes in (compute, wait):
        axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)

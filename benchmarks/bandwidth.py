"""Benchmark 4: allreduce latency and bus bandwidth for float32 buffers from 1 KiB to
256 MiB, Gloo against MPI (2 ranks), with this machine's single-core memory-copy
bandwidth measured in the same processes as the physical limit. Gloo and MPI launches
alternate over rounds; every figure is the median over rounds.
"""

from __future__ import annotations

from pathlib import Path

from common import horovod_result, interleaved, markdown_table, median, pyplot, write_result

from hvdtrain.jobs.launch import CONTROLLERS


def run(folder: Path, smoke: bool) -> dict:
    max_bytes, budget_s, rounds = (64 * 2**10, 0.01, 1) if smoke else (256 * 2**20, 0.3, 5)
    measured = interleaved(
        {controller: (lambda c=controller: horovod_result(
            "allreduce_worker.py", [str(max_bytes), str(budget_s)], controller=c))
         for controller in CONTROLLERS}, rounds, "allreduce bandwidth")
    table = []
    for index, row in enumerate(measured[CONTROLLERS[0]][0]["sizes"]):
        entry = {"bytes": row["bytes"]}
        for controller in CONTROLLERS:
            rows = [result["sizes"][index] for result in measured[controller]]
            entry[f"{controller}_latency_s"] = median([r["allreduce_s"] for r in rows])
            entry[f"{controller}_bus_bandwidth_gbps"] = median(
                [r["bus_bandwidth_gbps"] for r in rows])
        entry["copy_bandwidth_gbps"] = median(
            [result["sizes"][index]["copy_bandwidth_gbps"]
             for controller in CONTROLLERS for result in measured[controller]])
        table.append(entry)
    write_result(folder, "allreduce", {"max_bytes": max_bytes, "seconds_per_size": budget_s,
                                       "rounds": rounds, "workers": 2, "dtype": "float32"},
                 {"sizes": table})
    _plot(folder / "allreduce.png", table)
    return {"sizes": table}


def _plot(path: Path, table: list[dict]) -> None:
    plt = pyplot()
    figure, (latency, bandwidth) = plt.subplots(1, 2, figsize=(11, 4))
    sizes = [row["bytes"] for row in table]
    for controller in CONTROLLERS:
        latency.plot(sizes, [row[f"{controller}_latency_s"] * 1e3 for row in table], "o-",
                     label=controller)
        bandwidth.plot(sizes, [row[f"{controller}_bus_bandwidth_gbps"] for row in table], "o-",
                       label=controller)
    bandwidth.plot(sizes, [row["copy_bandwidth_gbps"] for row in table], "k--",
                   label="single-core copy")
    for axes, label in ((latency, "median allreduce time (ms)"),
                        (bandwidth, "bus bandwidth (GB/s)")):
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xlabel("buffer size (bytes)")
        axes.set_ylabel(label)
        axes.legend()
    figure.suptitle("Horovod allreduce, 2 ranks on one machine")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def targets(summary: dict) -> list[tuple[str, bool]]:
    return []  # no target: the figures are the result


def tables(result: dict) -> str:
    """The report's table (Markdown) from ``allreduce.json``."""
    def size(n: int) -> str:
        return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"

    rows = [[size(r["bytes"]), *(f"{1e3 * r[f'{c}_latency_s']:.2f} ms" for c in CONTROLLERS),
             *(f"{r[f'{c}_bus_bandwidth_gbps']:.3g} GB/s" for c in CONTROLLERS),
             f"{r['copy_bandwidth_gbps']:.3g} GB/s"] for r in result["sizes"]]
    return markdown_table(["size", *(f"{c} latency" for c in CONTROLLERS),
                           *(f"{c} bus bandwidth" for c in CONTROLLERS), "single-core copy"],
                          rows)

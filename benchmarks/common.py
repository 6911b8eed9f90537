"""What every benchmark shares: the machine's description, launching workers, interleaving
contenders, medians and ratios, progress lines and the result files.

Workers print one ``RESULT {json}`` line (rank 0, unless a benchmark says otherwise);
:func:`horovod_result` and :func:`torchrun_result` launch one and return it parsed.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hvdtrain.consistency import software_versions
from hvdtrain.jobs.launch import run_workers

HERE = Path(__file__).parent
# One compute thread per rank, so that 2 ranks on 2 cores compare fairly with 1 on 1.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
              "TF_CPP_MIN_LOG_LEVEL": "2"}
_STARTED = time.monotonic()


def progress(message: str) -> None:
    """One progress line, with the time since the benchmarks started."""
    print(f"[{time.monotonic() - _STARTED:6.0f} s] {message}", flush=True)


def machine() -> dict[str, Any]:
    """The machine and software the results were measured on."""
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"platform": platform.platform(), "processor": _cpu_model(),
            "cpus": os.cpu_count(), "memory_gib": round(memory_gb, 1),
            "python": platform.python_version(),
            **software_versions("hvdtrain", "horovod", "torch", "tensorflow-cpu", "keras",
                                "numpy", "mpi4py")}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def parse_result(output: str, where: str) -> dict[str, Any]:
    """The ``RESULT {json}`` line in a worker's output."""
    for line in output.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    raise RuntimeError(f"{where} printed no RESULT line:\n{output[-3000:]}")


def horovod_result(script: str, args: Sequence[str] = (), *, np: int = 2,
                   controller: str = "gloo", env: Mapping[str, str] | None = None,
                   timeout: float = 900) -> dict[str, Any]:
    """Run ``benchmarks/<script>`` on ``np`` ranks under horovodrun; rank 0's RESULT."""
    result = run_workers(HERE / script, list(args), np=np, controller=controller,
                         timeout=timeout, env={**ONE_THREAD, **(env or {})}).check()
    return parse_result(result.ranks[0].output, f"{script} rank 0")


def torchrun_result(script: str, args: Sequence[str] = (), *, np: int = 2,
                    env: Mapping[str, str] | None = None,
                    timeout: float = 900) -> dict[str, Any]:
    """Run ``benchmarks/<script>`` on ``np`` processes under torchrun; rank 0's RESULT
    (the worker prints it on rank 0 only)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", f"--nproc-per-node={np}",
               str(HERE / script), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **ONE_THREAD, **(env or {})})
    printed = "RESULT " in done.stdout
    if done.returncode != 0 and not printed:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    if done.returncode != 0:
        # Seen once in CI: a rank aborted in torch's Gloo teardown after every timed
        # step and the RESULT line were done. The measurement is complete; say so.
        progress(f"  warning: torchrun exited {done.returncode} after printing its result "
                 "(a crash while shutting down); the result is kept")
    return parse_result(done.stdout, script)


def concurrent_results(script: str, args: Sequence[str], copies: int,
                       timeout: float = 900) -> list[dict[str, Any]]:
    """Run ``copies`` independent single-process copies of ``benchmarks/<script>`` at
    the same time (no launcher, so no communication); each one's RESULT."""
    command = [sys.executable, str(HERE / script), *args]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env={**os.environ, **ONE_THREAD})
                 for _ in range(copies)]
    outputs = [process.communicate(timeout=timeout) for process in processes]
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        if process.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited {process.returncode}:\n"
                               f"{stderr[-3000:]}")
    return [parse_result(stdout, script) for stdout, _ in outputs]


def interleaved(contenders: Mapping[str, Callable[[], Any]], rounds: int,
                label: str) -> dict[str, list[Any]]:
    """Run every contender once per round, rotating the order (A B C, B C A, ...) so that
    none always goes first; returns each contender's results, round by round."""
    names = list(contenders)
    results: dict[str, list[Any]] = {name: [] for name in names}
    for round_number in range(rounds):
        for name in rotated(names, round_number):
            progress(f"{label}: round {round_number + 1}/{rounds}, {name}")
            results[name].append(contenders[name]())
    return results


def rotated(names: Sequence[str], round_number: int) -> list[str]:
    """The order of round ``round_number``: A B C, then B C A, then C A B, ..."""
    shift = round_number % len(names)
    return [*names[shift:], *names[:shift]]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def median_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """The median of the round-by-round ratios (robust to drifts in machine load)."""
    return median([a / b for a, b in zip(numerators, denominators, strict=True)])


def median_ratio_interval(numerators: Sequence[float],
                          denominators: Sequence[float]) -> tuple[float, float]:
    """A distribution-free ~95 % confidence interval for the median of the round ratios:
    the order statistics n/2 -+ 0.98 sqrt(n) (the sign test's normal approximation)."""
    ratios = sorted(a / b for a, b in zip(numerators, denominators, strict=True))
    half_width = 0.98 * math.sqrt(len(ratios))
    low = max(0, math.floor(len(ratios) / 2 - half_width))
    high = min(len(ratios) - 1, math.ceil(len(ratios) / 2 + half_width) - 1)
    return ratios[low], ratios[high]


def write_result(folder: Path, name: str, settings: Mapping[str, Any],
                 results: Mapping[str, Any]) -> Path:
    """``folder/<name>.json`` with the machine, the exact settings and the results."""
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(),
                                "settings": dict(settings), **results}, indent=2) + "\n")
    return path


def pyplot():
    """matplotlib's pyplot with a file-only backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bar_chart(path: Path, title: str, bars: Mapping[str, float], ylabel: str,
              reference: tuple[str, float] | None = None,
              ylim: tuple[float, float] | None = None) -> Path:
    """A bar chart of ``bars`` (label -> value) with an optional horizontal reference line
    and y range."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(max(5.0, 1.8 * len(bars)), 4.5))
    axes.bar([textwrap.fill(label, 16) for label in bars], list(bars.values()),
             color="tab:blue")
    if reference:
        axes.axhline(reference[1], color="tab:red", linestyle="--", label=reference[0])
        axes.legend()
    if ylim:
        axes.set_ylim(*ylim)
    axes.set_title(title)
    axes.set_ylabel(ylabel)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table (cells as given, already formatted)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def ms(seconds: float) -> str:
    """Seconds as milliseconds with two decimals, the unit of every step-time table."""
    return f"{1e3 * seconds:.2f} ms"

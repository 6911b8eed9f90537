"""The multi-rank test harness: real horovodrun launches, never mocks of Horovod.

A launch costs about 10 s, so each worker script in tests/workers runs many checks
and prints one ``REPORT {json}`` line per check and rank (and may save arrays to the
output folder it is given); tests assert on a :class:`Run`. Every launch has its own
timeout, below pytest-timeout's per-test limit (pyproject.toml), so a hung collective
fails its test instead of stalling CI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from hvdtrain.jobs.launch import LaunchResult, run_workers

WORKERS = Path(__file__).parent / "workers"
LAUNCH_TIMEOUT = 240.0


def launch(script: str, *args: str, controller: str = "gloo", np: int = 2,
           timeout: float = LAUNCH_TIMEOUT, env: dict[str, str] | None = None) -> LaunchResult:
    """Run ``tests/workers/<script>`` on ``np`` ranks."""
    return run_workers(WORKERS / script, args, np=np, controller=controller, timeout=timeout,
                       env=env)


def reports(result: LaunchResult) -> list[dict]:
    """Every rank's ``REPORT {json}`` lines, parsed, rank by rank."""
    return [
        json.loads(line.removeprefix("REPORT "))
        for rank in result.ranks
        for line in rank.output.splitlines()
        if line.startswith("REPORT ")
    ]


def single_process(script: str, *args: str, timeout: float = 120) -> tuple[dict, str]:
    """Run ``tests/workers/<script>`` as one process without a launcher (Horovod runs as
    a single worker); its one ``REPORT {json}`` line, parsed, and its stderr."""
    done = subprocess.run([sys.executable, str(WORKERS / script), *args],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("REPORT "))
    return json.loads(line.removeprefix("REPORT ")), done.stderr


class Run:
    """A finished 2-rank launch: reports by scenario and rank, saved arrays.

    A test asking for a scenario that failed (tests/workers/scenarios.py reports the
    traceback) or never reported fails with the scenario's name and why; the other
    scenarios of the same launch are judged on their own. :meth:`require_clean`
    checks the launch as a whole.
    """

    def __init__(self, result: LaunchResult, out_dir: Path) -> None:
        self.result, self.out_dir = result, out_dir
        self.by_scenario: dict[str, dict[int, dict]] = {}
        self.failures: dict[str, dict[int, str]] = {}
        for entry in reports(result):
            if "failed" in entry:
                self.failures.setdefault(entry["scenario"], {})[entry["rank"]] = entry["failed"]
            else:
                self.by_scenario.setdefault(entry["scenario"], {})[entry["rank"]] = entry

    def report(self, scenario: str, rank: int = 0) -> dict:
        """``scenario``'s report from ``rank``; fails the test naming the scenario when
        there is none."""
        found = self.by_scenario.get(scenario, {}).get(rank)
        if found is None:
            raise AssertionError(self._missing(scenario, rank))
        return found

    def both(self, scenario: str) -> tuple[dict, dict]:
        return self.report(scenario, 0), self.report(scenario, 1)

    def require_clean(self, expected_failures: tuple[str, ...] = ()) -> None:
        """Fail unless every scenario (but the ``expected_failures``, which a test checks
        on its own) ran without error and every rank exited with 0."""
        failures = {name: by_rank for name, by_rank in self.failures.items()
                    if name not in expected_failures}
        assert not failures, "scenarios failed: " + "; ".join(
            f"{name} (rank {rank}): {trace}" for name, by_rank in failures.items()
            for rank, trace in by_rank.items())
        self.result.check()

    def _missing(self, scenario: str, rank: int) -> str:
        failed = self.failures.get(scenario, {})
        if rank in failed:
            return f"scenario {scenario!r} failed on rank {rank}:\n{failed[rank]}"
        others = "; ".join(f"{name} (rank {r}): {trace.strip().splitlines()[-1]}"
                           for name, by_rank in self.failures.items()
                           for r, trace in by_rank.items())
        return (f"scenario {scenario!r} did not report on rank {rank}"
                + (f"; failed scenarios: {others}" if others else "")
                + (". The launch ended cleanly" if self.result.ok
                   else f". The launch failed:\n{self.result.report()[-6000:]}"))

    def arrays(self, name: str, rank: int = 0) -> list[np.ndarray]:
        """What the worker saved with np.savez as <name>-rank<rank>.npz, in order."""
        saved = np.load(self.out_dir / f"{name}-rank{rank}.npz")
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def max_difference(a, b) -> float:
    """Largest absolute difference between two equally long sequences of arrays."""
    return max(float(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max())
               for x, y in zip(a, b, strict=True))

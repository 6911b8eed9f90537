"""The multi-rank test harness: real horovodrun launches, never mocks of Horovod.

A launch costs about 10 s, so each worker script in tests/workers runs many checks
and prints one ``REPORT {json}`` line per check and rank (and may save arrays to the
output folder it is given); tests assert on a :class:`Run`. Every launch has its own
timeout, below pytest-timeout's per-test limit (pyproject.toml), so a hung collective
fails its test instead of stalling CI.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hvdtrain.launch import LaunchResult, run_workers

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


class Run:
    """A finished, successful 2-rank launch: reports by scenario and rank, saved arrays."""

    def __init__(self, result: LaunchResult, out_dir: Path) -> None:
        self.result, self.out_dir = result.check(), out_dir
        self.by_scenario: dict[str, dict[int, dict]] = {}
        for entry in reports(result):
            self.by_scenario.setdefault(entry["scenario"], {})[entry["rank"]] = entry

    def report(self, scenario: str, rank: int = 0) -> dict:
        return self.by_scenario[scenario][rank]

    def both(self, scenario: str) -> tuple[dict, dict]:
        return self.by_scenario[scenario][0], self.by_scenario[scenario][1]

    def arrays(self, name: str, rank: int = 0) -> list[np.ndarray]:
        """What the worker saved with np.savez as <name>-rank<rank>.npz, in order."""
        saved = np.load(self.out_dir / f"{name}-rank{rank}.npz")
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def max_difference(a, b) -> float:
    """Largest absolute difference between two equally long sequences of arrays."""
    return max(float(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max())
               for x, y in zip(a, b, strict=True))

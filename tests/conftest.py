"""Shared fixtures: real multi-process runs under horovodrun (never mocks of Horovod).

A launch costs about 10 s, so each worker script runs many checks and reports them
as JSON lines; tests assert on those reports. Each test also has pytest-timeout's
limit (pyproject.toml), and every launch has its own shorter one, so a hung
collective fails its test instead of stalling CI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hvdtrain.launch import CONTROLLERS, LaunchResult, run_workers

WORKERS = Path(__file__).parent / "workers"
LAUNCH_TIMEOUT = 180.0


def launch(script: str, *args: str, controller: str = "gloo", np: int = 2,
           timeout: float = LAUNCH_TIMEOUT) -> LaunchResult:
    """Run ``tests/workers/<script>`` on ``np`` ranks."""
    return run_workers(WORKERS / script, args, np=np, controller=controller, timeout=timeout)


def reports(result: LaunchResult) -> list[dict]:
    """Every rank's ``REPORT {json}`` lines, parsed, rank by rank."""
    return [
        json.loads(line.removeprefix("REPORT "))
        for rank in result.ranks
        for line in rank.output.splitlines()
        if line.startswith("REPORT ")
    ]


@pytest.fixture(params=CONTROLLERS)
def controller(request) -> str:
    """Each test taking this runs once with Gloo and once with MPI."""
    return request.param

"""Reading what tests/workers/torch_adapter.py saved, and what a one-process script
reports, for the tests/adapters/test_torch_*.py."""

import json
import subprocess
import sys

import torch


def tensors(run, name: str, rank: int = 0) -> dict[str, torch.Tensor]:
    """The parameters scenario ``name`` saved on ``rank``."""
    return torch.load(run.out_dir / f"{name}-rank{rank}.pt")


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two sets of named tensors."""
    return max((a[name].double() - b[name].double()).abs().max().item() for name in b)


def one_process_cases(script: str, timeout: float = 120) -> dict[str, list[dict]]:
    """Run ``script`` in a fresh Python (one worker, no launcher) and gather the JSON
    lines it prints, each ``{"case": name, ...}``, by case; fail with its stderr if it
    fails."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr
    found: dict[str, list[dict]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            found.setdefault(record.pop("case"), []).append(record)
    return found


"""The README's main job: examples/torch_digits.py under horovodrun -np 2."""

import re
from pathlib import Path

from hvdtrain.launch import run_workers

EXAMPLES = Path(__file__).parents[1] / "examples"
EPOCH_LINE = re.compile(r"epoch\s+(\d+)/(\d+)\s+lr ([\d.]+)\s+train loss ([\d.]+)\s+"
                        r"test accuracy ([\d.]+)")


def test_torch_digits_trains_and_only_rank_0_prints(controller):
    result = run_workers(EXAMPLES / "torch_digits.py", ["--epochs", "12"],
                         controller=controller, timeout=180).check()
    epochs = [EPOCH_LINE.search(line) for line in result.ranks[0].output.splitlines()]
    epochs = [m for m in epochs if m]
    assert [int(m[1]) for m in epochs] == list(range(1, 13))
    losses = [float(m[4]) for m in epochs]
    assert losses[-1] < losses[0] / 3
    assert float(epochs[-1][5]) >= 0.9
    assert not any(EPOCH_LINE.search(line) for line in result.ranks[1].output.splitlines())

"""save_checkpoint, load_checkpoint (hvdtrain/adapters/torch/checkpoint.py)
on 2 real ranks (Gloo and MPI), and a checkpoint resumed by another number of workers.

The launch, shared by tests/adapters/test_torch_*.py: conftest.py's ``torch_run``.
"""


import pytest
import torch
from harness import single_process

from hvdtrain.adapters.torch import LinearScalingWarmup
from hvdtrain.adapters.torch.checkpoint import CHECKPOINT_FORMAT
from hvdtrain.schedule import LinearScalingSchedule


def test_resume_from_checkpoint_continues_exactly(torch_run):
    for report in torch_run.both("checkpoint"):
        assert report["extra"] == {"step": 3, "note": "after 3 steps"}
        assert report["resumed"] == report["straight"]
        assert report["resumed_lrs"] == report["straight_lrs"]
        expected = LinearScalingSchedule(base_lr=0.01, batch_size_per_worker=4, world_size=2,
                                         steps_per_epoch=2, base_batch_size=4, warmup_epochs=2)
        assert report["straight_lrs"] == [expected.lr_at(step) for step in range(8)]


def test_failed_checkpoint_write_raises_everywhere_and_keeps_the_previous(torch_run):
    for report in torch_run.both("checkpoint"):
        assert "disk full (injected)" in report["torn_error"]
        assert report["leftovers"] == []
    payload = torch.load(torch_run.out_dir / "checkpoint.pt", weights_only=True)
    assert payload["extra"]["step"] == 3


def test_missing_checkpoint_raises_on_every_rank(torch_run):
    for report in torch_run.both("checkpoint_missing"):
        assert "missing.pt" in report["error"] and "FileNotFoundError" in report["error"]


def test_a_checkpoint_of_four_workers_resumes_on_one_with_the_rule_for_one(tmp_path):
    """A LinearScalingWarmup saved 30 steps into a 4-worker run (k = 8, 0.5 epochs into
    a 2-epoch warmup), loaded by a 1-worker job (k = 2): the rate is the 1-worker rule
    at 0.5 epochs, 0.05 + (2 x 0.05 - 0.05) x 0.5 / 2."""
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1024))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = LinearScalingWarmup(optimizer, batch_size_per_worker=4, base_batch_size=2,
                                    steps_per_epoch=60, warmup_epochs=2, world_size=4)
    for _ in range(30):
        optimizer.step()
        scheduler.step()
    torch.save({"format": CHECKPOINT_FORMAT, "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "extra": {}}, tmp_path / "four_workers.pt")
    resumed, _ = single_process("checkpoint_single.py", "resize", str(tmp_path))
    assert resumed["world_size"] == 1 and resumed["samples_seen"] == 30 * 16
    assert resumed["lr"] == pytest.approx(0.0625, rel=1e-12)

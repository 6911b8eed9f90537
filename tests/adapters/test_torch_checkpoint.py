"""save_checkpoint, load_checkpoint (hvdtrain/adapters/torch/checkpoint.py)
on 2 real ranks (Gloo and MPI).

The launch, shared by tests/adapters/test_torch_*.py: conftest.py's ``torch_run``.
"""

import torch

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

"""Drawing with matplotlib: a :class:`~hvdtrain.schedule.LinearScalingSchedule` here,
the step timing's records in :mod:`hvdtrain.jobs.report`."""

from __future__ import annotations

import os
from types import ModuleType

from hvdtrain.schedule import LinearScalingSchedule


def pyplot() -> ModuleType:
    """``matplotlib.pyplot``, drawing to files only.

    Raises:
        ImportError: saying how to install matplotlib.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "plotting needs matplotlib: pip install 'hvdtrain[plot]' (or pip install matplotlib)"
        ) from None
    return plt


def plot_schedule(
    schedule: LinearScalingSchedule, epochs: int, path: str | os.PathLike[str]
) -> None:
    """Draw the learning rate of every step of ``epochs`` epochs into the image ``path``."""
    plt = pyplot()
    steps = range(epochs * schedule.steps_per_epoch)
    figure, axes = plt.subplots(figsize=(8, 4.5))
    axes.plot([s / schedule.steps_per_epoch for s in steps], [schedule.lr_at(s) for s in steps])
    if schedule.warmup_steps:
        axes.axvline(schedule.warmup_steps / schedule.steps_per_epoch, linestyle=":",
                     color="gray", label="end of warmup")
        axes.legend()
    axes.set_xlabel("epoch")
    axes.set_ylabel("learning rate")
    axes.set_title(f"eta={schedule.base_lr:g}, global batch {schedule.global_batch_size} "
                   f"(k={schedule.scale:g}), warmup {schedule.warmup_epochs:g} epochs")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)

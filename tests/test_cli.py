"""The hvdtrain command: `schedule` (table and plot) and `env` (`doctor`: test_doctor.py)."""

import pytest

from hvdtrain.jobs.cli import main
from hvdtrain.runtime import LAUNCHER_DEFAULTS, RUNTIME_DEFAULTS
from hvdtrain.schedule import LinearScalingSchedule

SCHEDULE_ARGS = ["schedule", "--base-lr", "0.1", "--batch-size-per-worker", "32",
                 "--world-size", "16", "--steps-per-epoch", "10", "--epochs", "8",
                 "--milestones", "6,7"]


def table_rows(output: str) -> dict[int, tuple[float, float]]:
    rows = {}
    for line in output.splitlines():
        parts = line.split()
        if parts and parts[0].isdigit():
            rows[int(parts[0])] = (float(parts[2]), float(parts[3]))
    return rows


def test_schedule_table_matches_the_schedule(capsys):
    assert main(SCHEDULE_ARGS) == 0
    out = capsys.readouterr().out
    assert "k = 2" in out and "warmup 50 steps" in out
    expected = LinearScalingSchedule(base_lr=0.1, batch_size_per_worker=32, world_size=16,
                                     steps_per_epoch=10, milestones=(6, 7))
    rows = table_rows(out)
    assert sorted(rows) == list(range(8))
    for epoch, (first, last) in rows.items():
        assert first == pytest.approx(expected.lr_at(epoch * 10), rel=1e-5)
        assert last == pytest.approx(expected.lr_at(epoch * 10 + 9), rel=1e-5)


def test_schedule_plot_writes_a_png(tmp_path, capsys):
    image = tmp_path / "lr.png"
    assert main([*SCHEDULE_ARGS, "--plot", str(image)]) == 0
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {image}" in capsys.readouterr().out


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--base-lr", "0", "base_lr must be a finite number > 0"),
    ("--milestones", "7,6", "milestones must be strictly ascending"),
    ("--milestones", "a,b", "comma-separated epochs"),
    ("--epochs", "3", "is longer than training"),
])
def test_schedule_rejects_bad_input_with_a_reason(flag, value, message, capsys):
    args = list(SCHEDULE_ARGS)
    args[args.index(flag) + 1] = value
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_env_prints_exports_for_the_defaults_not_yet_set(monkeypatch, capsys):
    monkeypatch.setenv("OMPI_MCA_oob_tcp_keepalive_time", "99")
    for name in RUNTIME_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    assert main(["env"]) == 0
    exports = dict(line.removeprefix("export ").split("=", 1)
                   for line in capsys.readouterr().out.splitlines())
    assert exports == {**RUNTIME_DEFAULTS, **{name: value for name, value in
                                              LAUNCHER_DEFAULTS.items()
                                              if name != "OMPI_MCA_oob_tcp_keepalive_time"}}

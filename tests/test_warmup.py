"""hvdtrain.warmup: the settings every adapter's LinearScalingWarmup takes, validated once,
and the one agreement across ranks, checked on 2 real ranks in all four adapters."""

import pytest
from harness import launch, reports
from workers.warmup_agreement import DIFFERENT, FROM_THE_OPTIMIZER, SETTINGS

from hvdtrain.schedule import LinearScalingSchedule
from hvdtrain.warmup import WarmupSettings


class Workers:
    """A fixed group of workers, as the core sees one (hvdtrain.collective.Collective)."""

    init_call = "hvx.init()"

    def __init__(self, size: int, connected: bool = True) -> None:
        self._size, self._connected = size, connected

    def is_initialized(self) -> bool:
        return self._connected

    def size(self) -> int:
        return self._size


def test_the_settings_make_the_schedule_with_eta_and_the_workers():
    settings = WarmupSettings.of(batch_size_per_worker=32, steps_per_epoch=10, milestones=[3])
    assert settings.schedule(0.1, world_size=16) == LinearScalingSchedule(
        base_lr=0.1, batch_size_per_worker=32, world_size=16, steps_per_epoch=10,
        milestones=(3,))
    counted = settings.schedule(0.1, world_size=16, steps_per_epoch=5, passes=2)
    assert (counted.steps_per_epoch, counted.backward_passes_per_step) == (5, 2)


@pytest.mark.parametrize(("arguments", "error", "message"), [
    ({"batch_size_per_worker": 0}, ValueError, "batch_size_per_worker must be an int > 0, got 0"),
    ({"batch_size_per_worker": 2, "steps_per_epoch": 0}, ValueError,
     "steps_per_epoch must be an int > 0, got 0"),
    ({"batch_size_per_worker": 2, "world_size": 0}, ValueError,
     "world_size must be an int > 0, got 0"),
    ({"batch_size_per_worker": 2, "backward_passes_per_step": 1.5}, ValueError,
     "backward_passes_per_step must be an int > 0, got 1.5"),
    ({"batch_size_per_worker": 2, "warmup_epochs": -1}, ValueError,
     "warmup_epochs must be a finite number >= 0"),
    ({"batch_size_per_worker": 2, "gamma": 0}, ValueError, "gamma must be a finite number > 0"),
    ({"batch_size_per_worker": 2, "milestones": (30, 10)}, ValueError,
     "milestones must be strictly ascending, got (30, 10)"),
    ({"batch_size_per_worker": 2, "warmup_epoch": 5}, TypeError,
     "LinearScalingWarmup got an unknown argument warmup_epoch; it takes batch_size_per_worker,"),
    ({"steps_per_epoch": 5}, TypeError, "LinearScalingWarmup needs batch_size_per_worker="),
])
def test_bad_settings_say_what_is_wrong(arguments, error, message):
    with pytest.raises(error) as raised:
        WarmupSettings.of(**arguments)
    assert message in str(raised.value)


def test_what_an_adapter_fills_in_is_checked_against_what_it_knows():
    settings = WarmupSettings.of(batch_size_per_worker=2)
    with pytest.raises(TypeError, match="needs steps_per_epoch=, the optimizer steps"):
        settings.require_steps_per_epoch()
    assert settings.passes(4) == 4
    with pytest.raises(ValueError, match="the optimizer accumulates 4 backward passes per step "
                                         "but LinearScalingWarmup got backward_passes_per_step=2"):
        WarmupSettings.of(batch_size_per_worker=2, backward_passes_per_step=2).passes(4)
    assert settings.workers(Workers(8)) == 8
    with pytest.raises(RuntimeError, match=r"needs the workers connected: call hvx.init\(\)"):
        settings.workers(Workers(8, connected=False))
    fixed = WarmupSettings.of(batch_size_per_worker=2, world_size=4)
    assert fixed.workers(Workers(8, connected=False)) == 4
    with pytest.raises(ValueError, match=r"world_size=4 contradicts the launcher's 8 workers "
                                         r"\(hvx.size\(\)\)"):
        fixed.workers(Workers(8))


# Each adapter's launch: one process runs every setting's disagreement in turn.
LAUNCHES = {"torch": ("torch", "gloo"), "keras": ("keras", "mpi"),
            "tensorflow": ("keras", "mpi"), "numpy": ("numpy", "mpi")}
CASES = [(adapter, setting) for adapter in LAUNCHES for setting in DIFFERENT
         if adapter in ("tensorflow", "numpy") or setting not in FROM_THE_OPTIMIZER]


@pytest.fixture(scope="module")
def agreement_errors():
    """``{(adapter, setting): {rank: error}}`` from one launch per framework, on demand."""
    found: dict[tuple[str, str], dict[int, str | None]] = {}
    launched: set[str] = set()

    def errors(adapter: str, setting: str) -> dict[int, str | None]:
        framework, controller = LAUNCHES[adapter]
        if framework not in launched:
            launched.add(framework)
            result = launch("warmup_agreement.py", framework, controller=controller,
                            timeout=300)
            for entry in reports(result):
                assert "failed" not in entry, f"{entry['scenario']}: {entry['failed']}"
                scenario_adapter, scenario_setting = entry["scenario"].split()
                found.setdefault((scenario_adapter, scenario_setting), {})[entry["rank"]] = \
                    entry["error"]
            result.check()
        return found.get((adapter, setting), {})

    return errors


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("adapter", "setting"), CASES)
def test_a_rank_with_another_setting_stops_every_rank_with_the_same_error(
        agreement_errors, adapter, setting):
    errors = agreement_errors(adapter, setting)
    assert sorted(errors) == [0, 1], f"{adapter} {setting}: reports from ranks {sorted(errors)}"
    theirs = DIFFERENT[setting]
    mine = 0.1 if setting == "base_lr" else SETTINGS.get(setting)
    if setting == "base_lr" and adapter == "torch":  # one η per param group
        mine, theirs = [mine], [theirs]
    if setting == "milestones":
        mine, theirs = tuple(mine), tuple(theirs)
    if setting == "backward_passes_per_step":
        mine = 1
    expected = (f"LinearScalingWarmup: the ranks disagree: {setting} is {mine!r} on rank 0 "
                f"but {theirs!r} on rank 1")
    for rank in (0, 1):
        assert errors[rank] is not None, f"{adapter} {setting}: rank {rank} raised nothing"
        assert errors[rank].startswith(expected), (adapter, setting, rank, errors[rank])

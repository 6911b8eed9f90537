"""hvdtrain.step_timing: the timer against hand-driven clocks (ranks as threads, their
exchange summed in the test), then real launches on 2 and 3 ranks, Gloo and MPI, where
the last rank sleeps a known time more per step (tests/workers/stragglers.py; torch
flat, overlapped and sharded, Keras fit on both backends, TensorFlow's tape, NumPy): it
is named within two windows, its excess compute is the sleep within 20 %, even ranks get no
line, and the metrics file reads back through ``hvdtrain report``."""

from __future__ import annotations

import functools
import statistics
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from harness import Run, launch

from hvdtrain import step_timing
from hvdtrain.step_timing import (
    DEFAULT_REPORT_SECONDS,
    HOST_BYTES,
    SETTLING_STEPS,
    StepTimer,
    TimingSettings,
    pack,
    steps_until,
    unpack,
)
from hvdtrain.stragglers import StragglerReport, read_records

sys.path.insert(0, str(Path(__file__).parent / "workers"))
from stragglers import EXTRA_SLEEP


def test_settings_default_to_a_minute_and_zero_turns_the_lines_off():
    default = TimingSettings.from_environment({})
    assert (default.window_s, default.lines, default.metrics_path) == (
        DEFAULT_REPORT_SECONDS, True, None)
    assert default.enabled
    off = TimingSettings.from_environment({step_timing.REPORT_SECONDS_VARIABLE: "0"})
    assert not off.lines and not off.enabled
    file_only = TimingSettings.from_environment({step_timing.REPORT_SECONDS_VARIABLE: "0",
                                                 step_timing.METRICS_FILE_VARIABLE: "r.jsonl"})
    assert file_only.enabled and not file_only.lines and file_only.window_s == 60
    assert TimingSettings.from_environment(
        {step_timing.REPORT_SECONDS_VARIABLE: "2.5"}).window_s == 2.5


@pytest.mark.parametrize("text", ["soon", "-1", "inf", "nan"])
def test_a_bad_interval_says_what_to_set(text):
    with pytest.raises(ValueError, match=r"HVDTRAIN_STRAGGLER_REPORT_SECONDS=.*number of "
                                         r"seconds >= 0.*or 0 to turn the straggler report off"):
        TimingSettings.from_environment({step_timing.REPORT_SECONDS_VARIABLE: text})


def test_each_rank_fills_its_own_slot_and_the_sum_holds_every_rank_and_host():
    hosts = ["node-a", "nöde-b", "x" * (HOST_BYTES + 10)]
    vectors = [pack(rank, 3, [rank + 1.0, 0.5 * rank], hosts[rank]) for rank in range(3)]
    summed = [sum(column) for column in zip(*vectors, strict=True)]
    slots = unpack(summed, 3, hosts=True)
    assert [numbers[:2] for numbers, _ in slots] == [[1.0, 0.0], [2.0, 0.5], [3.0, 1.0]]
    assert [host for _, host in slots] == ["node-a", "nöde-b", "x" * HOST_BYTES]
    assert unpack(pack(1, 2, [7.0], None), 2, hosts=False) == [([0.0], None), ([7.0], None)]


def test_the_host_is_the_launchers_name_for_it_else_the_machines():
    import socket

    assert step_timing.this_host({"HOROVOD_HOSTNAME": "node-7"}) == "node-7"
    for unnamed in ({"HOROVOD_HOSTNAME": "localhost"}, {}):
        assert step_timing.this_host(unnamed) == socket.gethostname()


def test_steps_until_covers_the_time_left():
    assert steps_until(1.0, 0.3) == 4
    assert steps_until(0.0, 0.3) == 1
    assert steps_until(5.0, 0.0) == 1


class ThreadRanks:
    """Ranks as threads: each has a clock the test advances, and ``sum_numbers`` adds
    up what every thread sent (the allreduce), recording each exchange's name."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size)
        self.sent: dict[int, list[float]] = {}
        self.names: dict[int, list[str]] = {rank: [] for rank in range(size)}
        self.local = threading.local()
        self.now = [0.0] * size
        self.joined: set[int] = set()

    def rank(self) -> int:
        return self.local.rank

    def sum_numbers(self, numbers: list[float], name: str) -> list[float]:
        self.names[self.rank()].append(name)
        self.sent[self.rank()] = numbers
        self.barrier.wait()
        total = [sum(column) for column in zip(
            *(sent or [0.0] * len(numbers) for sent in self.sent.values()), strict=True)]
        self.barrier.wait()
        return total

    def join(self, rank: int) -> None:
        """Horovod's join: until every rank has joined, add zeros to the others'
        allreduces."""
        self.joined.add(rank)
        while True:
            self.sent[rank] = None
            self.barrier.wait()
            done = len(self.joined) == self.size
            self.barrier.wait()
            if done:
                return

    def run(self, body) -> None:
        errors = []

        def start(rank: int) -> None:
            self.local.rank = rank
            try:
                body(rank)
            except BaseException as error:
                errors.append(error)
                self.barrier.abort()

        threads = [threading.Thread(target=start, args=(rank,)) for rank in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not errors, errors


class Collected(StragglerReport):
    def __init__(self) -> None:
        super().__init__(lines=False)
        self.windows = []

    def window(self, window) -> None:
        self.windows.append(window)


def timers(ranks: ThreadRanks, window_s: float) -> list[StepTimer]:
    settings = TimingSettings(window_s=window_s, lines=True, metrics_path=None)

    class Workers:
        def rank(self):
            return ranks.rank()

        def size(self):
            return ranks.size

    return [StepTimer(Workers(), ranks.sum_numbers, settings, report=Collected(),
                      clock=functools.partial(ranks.now.__getitem__, rank), wall=lambda: 0.0,
                      host=f"host-{rank}")
            for rank in range(ranks.size)]


def steps(ranks: ThreadRanks, timer: StepTimer, rank: int, count: int, compute: float,
          reduction: float) -> None:
    """``count`` steps of the given compute and reduction on ``rank``'s clock."""
    for _ in range(count):
        ranks.now[rank] += compute
        timer.reduction_started(0)
        ranks.now[rank] += reduction
        timer.reduction_finished(0)
        timer.step_finished(0, True)


def test_the_ranks_exchange_at_the_same_step_and_hold_the_same_windows():
    ranks = ThreadRanks(3)
    clocks = timers(ranks, window_s=1.0)
    computes = [0.010, 0.010, 0.040]  # rank 2 computes 30 ms more; the others wait for it

    def body(rank: int) -> None:
        steps(ranks, clocks[rank], rank, 200, computes[rank],
              0.001 + max(computes) - computes[rank])

    ranks.run(body)
    assert ranks.names[0] == ranks.names[1] == ranks.names[2]
    assert ranks.names[0][0] == "hvdtrain.step_times.hosts"  # the first exchange only
    assert set(ranks.names[0][1:]) == {"hvdtrain.step_times"}
    assert clocks[0].latest == clocks[1].latest == clocks[2].latest
    reported = clocks[0].report.windows
    assert len(reported) >= 7 and not clocks[1].report.windows  # rank 0 reports, alone
    # the window ends after 1 s at the earliest, at the first exchange past it
    assert all(1.0 <= window.seconds < 1.2 for window in reported)
    first = reported[0]
    assert [t.host for t in first.ranks] == ["host-0", "host-1", "host-2"]
    assert [round(t.compute_s, 6) for t in first.ranks] == computes
    assert first.communication_s == pytest.approx(0.001)
    assert [round(first.wait_s(t), 6) for t in first.ranks] == [0.03, 0.03, 0.0]
    # the settling steps are not in any window
    assert sum(window.steps for window in reported) <= 200 - SETTLING_STEPS


def test_a_joined_rank_is_left_out_and_after_the_join_every_rank_starts_anew():
    ranks = ThreadRanks(2)
    clocks = timers(ranks, window_s=0.5)
    windows_alone = []

    def body(rank: int) -> None:
        steps(ranks, clocks[rank], rank, 40, 0.02, 0.001)
        if rank == 0:  # rank 1 has run out of data: rank 0 goes on alone
            steps(ranks, clocks[0], 0, 100, 0.02, 0.001)
            windows_alone.append(clocks[0].latest)
        ranks.join(rank)
        clocks[rank].restart()  # what every adapter's join() does
        ranks.names[rank].append("joined")
        steps(ranks, clocks[rank], rank, 60, 0.02, 0.001)

    ranks.run(body)
    assert [t.rank for t in windows_alone[0].ranks] == [0]
    after = [names[names.index("joined"):] for names in ranks.names.values()]
    assert after[0] == after[1] and len(after[0]) > 2
    assert clocks[0].latest == clocks[1].latest
    assert [t.rank for t in clocks[0].latest.ranks] == [0, 1]


# The launches: every framework's training paths on 2 and 3 ranks (NumPy needs MPI).
# Keras on its torch backend once, on 2 ranks under Gloo.
LAUNCHES = [(framework, controller, np)
            for framework, controllers in [("torch", ("gloo", "mpi")), ("keras", ("gloo", "mpi")),
                                           ("numpy", ("mpi",))]
            for controller in controllers for np in (2, 3)] + [("keras_torch", "gloo", 2)]
SLOW_MODES = {"torch": ["slow_flat", "slow_overlap", "slow_shard_gradients"],
              "keras": ["slow_fit", "slow_tape"], "keras_torch": ["slow_fit"],
              "numpy": ["slow_sgd"]}
EVEN_MODES = {"torch": "even_flat", "keras": "even_fit", "keras_torch": "even_fit",
              "numpy": "even_sgd"}


@functools.cache
def timed_launch(framework: str, controller: str, np: int) -> tuple[Run, Path]:
    """One launch of tests/workers/stragglers.py with 1 s windows and a metrics file."""
    import tempfile

    out = Path(tempfile.mkdtemp(prefix=f"hvdtrain-stragglers-{framework}-"))
    metrics = out / "run.jsonl"
    worker, _, backend = framework.partition("_")
    result = launch("stragglers.py", worker, controller=controller, np=np, timeout=200,
                    env={step_timing.REPORT_SECONDS_VARIABLE: "1",
                         step_timing.METRICS_FILE_VARIABLE: str(metrics),
                         "KERAS_BACKEND": backend or "tensorflow"})
    return Run(result, out), metrics


def lines_during(run: Run, mode: str) -> list[str]:
    """Rank 0's window lines (not the end-of-run line) between ``MODE mode`` and the next."""
    output = run.result.ranks[0].output.split(f"MODE {mode}\n", 1)[1].split("MODE ", 1)[0]
    return [line for line in output.splitlines()
            if line.startswith("hvdtrain: rank") and "over the last" in line]


def without_time(record: dict) -> dict:
    return {key: value for key, value in record.items() if key != "time"}


def launch_id(value) -> str:
    return "-".join(map(str, value))


@pytest.mark.parametrize("mode_launch", [(mode, *key) for key in LAUNCHES
                                         for mode in SLOW_MODES[key[0]]], ids=launch_id)
def test_a_rank_slowed_by_a_known_sleep_is_named_with_its_excess_compute(mode_launch):
    mode, *key = mode_launch
    run, _ = timed_launch(*key)
    np = key[2]
    slow = np - 1
    windows = run.report(mode, 0)["windows"]
    for rank in range(1, np):  # the same numbers on every rank (but each its own clock)
        assert [without_time(w) for w in run.report(mode, rank)["windows"]] == [
            without_time(w) for w in windows], "the ranks' windows differ"
    assert len(windows) >= 2, f"fewer than two windows of 1 s: {windows}"
    assert slow in [window["straggler"] for window in windows[:2]], windows[:2]
    excess = [next(r["compute_ms"] for r in window["ranks"] if r["rank"] == slow)
              - statistics.median(r["compute_ms"] for r in window["ranks"] if r["rank"] != slow)
              for window in windows]
    assert statistics.median(excess) == pytest.approx(EXTRA_SLEEP * 1e3, rel=0.2), excess
    lines = lines_during(run, mode)
    assert lines and all(line.startswith(f"hvdtrain: rank {slow} (") for line in lines), lines
    assert len(lines) <= len(windows)  # at most one line per window


@pytest.mark.parametrize("key", LAUNCHES, ids=launch_id)
def test_even_ranks_get_no_straggler_line(key):
    run, _ = timed_launch(*key)
    mode = EVEN_MODES[key[0]]
    windows = run.report(mode, 0)["windows"]
    assert windows, "no window completed"
    assert [window["straggler"] for window in windows] == [None] * len(windows)
    assert lines_during(run, mode) == []


@pytest.mark.parametrize("key", LAUNCHES, ids=launch_id)
def test_the_metrics_file_holds_every_window_and_hvdtrain_report_reads_it(key, tmp_path):
    run, metrics = timed_launch(*key)
    # Every mode ran cleanly (the exit itself is Horovod's: under Gloo a rank has once
    # aborted in its teardown after every report was out).
    assert not run.failures, run.failures
    records = list(read_records(metrics))
    reported = [window for mode in [*SLOW_MODES[key[0]], EVEN_MODES[key[0]]]
                for window in run.report(mode, 0)["windows"]]
    assert records == reported  # rank 0 wrote each window, once, in order (the modes' order)
    assert {record["world_size"] for record in records} == {key[2]}
    samples = [record["samples_per_second"] for record in records]
    if key[0].startswith("keras"):  # its batch was not given
        assert samples == [None] * len(samples)
    else:
        assert all(s == pytest.approx(r["steps_per_second"] * key[2] * 16, rel=0.01)
                   for s, r in zip(samples, records, strict=True))
    plot = tmp_path / "times.png"
    done = subprocess.run([sys.executable, "-m", "hvdtrain.jobs.cli", "report", str(metrics),
                           "--plot", str(plot)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{len(records)} windows over" in done.stdout
    for rank in range(key[2]):
        assert f"\n{rank:>4}  " in done.stdout
    assert plot.stat().st_size > 10_000
    if key[0].startswith("keras"):
        logs = run.report("slow_fit_logs", 0)["logs"]
        assert logs["straggler"] == key[2] - 1 and logs["slowest_rank"] == key[2] - 1
        assert logs == run.report("slow_fit_logs", 1)["logs"]


def test_paused_steps_reach_no_timer_and_the_gap_is_not_compute():
    from hvdtrain.step_events import step_observers

    class Alone:
        def rank(self):
            return 0

        def size(self):
            return 1

    now = [0.0]
    timer = step_timing.start(Alone(), lambda numbers, name: numbers, environ={})
    try:
        timer._clock = lambda: now[0]  # the module's timer, on a test clock
        timer.restart()
        for _ in range(SETTLING_STEPS + 2):
            now[0] += 0.01
            step_observers.reduction_started(0)
            step_observers.reduction_finished(0)
        counted = timer._reductions
        with step_timing.paused():
            assert not step_observers
            now[0] += 5.0  # steps no timer sees
        assert step_observers and timer._reductions == counted
        before = timer._sums[1]  # the compute seconds
        now[0] += 0.01
        step_observers.reduction_started(0)
        assert timer._sums[1] == before  # the 5 s gap is not compute
    finally:
        step_timing.stop()
    assert not step_observers and step_timing.step_times() is None

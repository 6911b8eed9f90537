"""The collective watchdog on its own, in one process (its multi-rank behaviour is in
test_faults.py and test_multihost.py)."""

import threading

import pytest

from hvdtrain import watchdog
from hvdtrain.watchdog import TIMEOUT_VARIABLE, Watchdog


def _expiring_watchdog(tmp_path, timeout_s, rank=0, size=2):
    expired = threading.Event()
    stream = (tmp_path / "report.txt").open("w+")
    dog = Watchdog(rank, size, timeout_s, poll_s=0.05, stream=stream, on_expiry=expired.set)
    return dog, expired, stream


def test_a_wait_longer_than_the_limit_is_reported_with_the_stacks(tmp_path):
    dog, expired, stream = _expiring_watchdog(tmp_path, 0.2)
    with dog.guard(lambda: "the allreduce of 'w'"):
        assert expired.wait(5)
    stream.seek(0)
    report = stream.read()
    assert "rank 0 of 2 waited 0 s (limit 0.2 s) for the allreduce of 'w'; rank 1 did not" \
        in report
    assert TIMEOUT_VARIABLE in report
    assert "test_a_wait_longer_than_the_limit_is_reported" in report  # this thread's stack


@pytest.mark.parametrize("sink_fails", [False, True])
def test_the_report_is_forwarded_before_the_process_ends(tmp_path, sink_fails):
    """on_report (hvdtrain.jobs.ray's way to the driver) gets the report first; a sink that
    fails is said so and the process still ends."""
    events = []

    def sink(report):
        events.append(("report", report))
        if sink_fails:
            raise ConnectionError("driver gone")

    expired = threading.Event()
    stream = (tmp_path / "report.txt").open("w+")
    dog = Watchdog(1, 2, 0.2, poll_s=0.05, stream=stream,
                   on_expiry=lambda: events.append(("expired",)) or expired.set(),
                   on_report=sink)
    with dog.guard("the broadcast"):
        assert expired.wait(5)
    assert [event[0] for event in events] == ["report", "expired"]
    assert events[0][1].startswith("hvdtrain: rank 1 of 2 waited")
    stream.seek(0)
    assert ("could not forward the watchdog's report: driver gone" in stream.read()) \
        == sink_fails


def test_waits_within_the_limit_end_nothing(tmp_path):
    dog, expired, _ = _expiring_watchdog(tmp_path, 0.5)
    for _ in range(10):
        with dog.guard("a quick collective"):
            pass
    assert dog.oldest_wait() is None
    assert not expired.wait(1.0)
    dog.stop()


def test_the_description_is_only_built_when_reported(tmp_path):
    dog, _, _ = _expiring_watchdog(tmp_path, 60)
    built = []
    with dog.guard(lambda: built.append(1) or "x"):
        _, waited = dog.oldest_wait()
    assert not built and waited < 60
    dog.stop()


def test_larger_jobs_name_every_other_rank(tmp_path):
    dog, _, _ = _expiring_watchdog(tmp_path, 60, rank=2, size=4)
    assert "at least one of ranks 0, 1, 3 did not complete it" in dog.report("x", 61)
    dog.stop()


def test_nothing_is_watched_for_one_worker_or_a_zero_limit(monkeypatch):
    watchdog.start(rank=0, size=1)
    assert watchdog._active is None
    monkeypatch.setenv(TIMEOUT_VARIABLE, "0")
    watchdog.start(rank=0, size=2)
    assert watchdog._active is None
    with watchdog.guard("anything"):
        pass


@pytest.mark.parametrize("text", ["soon", "-1", "nan", "inf", ""])
def test_a_malformed_limit_says_what_to_set(monkeypatch, text):
    monkeypatch.setenv(TIMEOUT_VARIABLE, text)
    with pytest.raises(ValueError, match=f"{TIMEOUT_VARIABLE}=.* is not a number of seconds"):
        watchdog.timeout_seconds()


def test_a_non_positive_limit_is_refused():
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        Watchdog(0, 2, 0)

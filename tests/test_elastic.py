"""hvdtrain.elastic in one process: the bound on a reset, its message and its input.
The bound in real elastic jobs is tested in tests/adapters/test_torch_elastic.py and
test_keras_elastic.py (a launcher that leaves its workers behind)."""

import io
import threading
import time

import pytest

from hvdtrain import elastic


def test_the_bound_is_the_launchers_elastic_timeout_plus_the_margin():
    assert elastic.reset_limit_seconds({"HOROVOD_ELASTIC_TIMEOUT": "45"}) == (
        45 + elastic.RESET_MARGIN_SECONDS)
    assert elastic.reset_limit_seconds({}) == (
        elastic.DEFAULT_ELASTIC_TIMEOUT_SECONDS + elastic.RESET_MARGIN_SECONDS)


@pytest.mark.parametrize("text", ["", "ten", "0", "-5", "inf", "nan"])
def test_a_malformed_elastic_timeout_is_refused_with_the_fix(text):
    with pytest.raises(ValueError, match=rf"HOROVOD_ELASTIC_TIMEOUT='{text}' is not a number "
                                         r"of seconds > 0.*--elastic-timeout N"):
        elastic.bounded_reset(lambda: None, environ={"HOROVOD_ELASTIC_TIMEOUT": text})


def test_a_reset_that_outlasts_the_bound_is_ended_with_the_cause(monkeypatch):
    monkeypatch.setattr(elastic, "RESET_MARGIN_SECONDS", 0.1)
    stream, ended = io.StringIO(), threading.Event()
    release = threading.Event()
    reset = elastic.bounded_reset(lambda: release.wait(10), stream=stream,
                                  environ={"HOROVOD_ELASTIC_TIMEOUT": "0.2"},
                                  on_expiry=lambda: (ended.set(), release.set()))
    started = time.monotonic()
    reset()
    assert ended.is_set()
    assert 0.25 <= time.monotonic() - started < 5
    assert stream.getvalue() == elastic.reset_timeout_message(0.3, 0.2) + "\n"
    assert stream.getvalue().startswith(
        "hvdtrain: the job did not re-form within 0.3 s: fewer than --min-np workers left? "
        "Horovod's elastic driver waits 0.2 s (horovodrun --elastic-timeout")


def test_a_reset_within_the_bound_leaves_no_timer_behind(monkeypatch):
    monkeypatch.setattr(elastic, "RESET_MARGIN_SECONDS", 0.1)
    expired = threading.Event()
    reset = elastic.bounded_reset(lambda: None, environ={"HOROVOD_ELASTIC_TIMEOUT": "0.1"},
                                  on_expiry=expired.set, stream=io.StringIO())
    for _ in range(3):
        reset()
    time.sleep(0.5)
    assert not expired.is_set()
    assert not [t for t in threading.enumerate() if t.name == "hvdtrain-reset-deadline"]


def test_a_reset_that_raises_still_cancels_its_timer(monkeypatch):
    monkeypatch.setattr(elastic, "RESET_MARGIN_SECONDS", 0.1)
    expired = threading.Event()

    def failing() -> None:
        raise RuntimeError("host-c[0] has been removed from elastic job")

    reset = elastic.bounded_reset(failing, environ={"HOROVOD_ELASTIC_TIMEOUT": "0.1"},
                                  on_expiry=expired.set, stream=io.StringIO())
    with pytest.raises(RuntimeError, match="removed from elastic job"):
        reset()
    time.sleep(0.5)
    assert not expired.is_set()

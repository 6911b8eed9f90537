"""The multi-rank harness itself: real horovodrun runs with Gloo and with MPI."""

import time

import pytest
from harness import launch, reports

from hvdtrain.jobs.launch import LaunchError, run_workers


def test_collectives_match_an_independent_computation(controller):
    result = launch("collectives.py", controller=controller).check()
    by_rank = {r["rank"]: r for r in reports(result)}
    assert sorted(by_rank) == [0, 1]
    sent = [by_rank[r]["sent"] for r in (0, 1)]
    expected_sum = [a + b for a, b in zip(*sent, strict=True)]
    for report in by_rank.values():
        assert report["size"] == 2
        assert report["sum"] == pytest.approx(expected_sum)
        assert report["average"] == pytest.approx([s / 2 for s in expected_sum])
        assert report["broadcast"] == sent[0]
        assert report["allgather"] == sent


def test_each_rank_has_its_own_exit_code_and_output(tmp_path):
    result = launch("exit_codes.py", str(tmp_path))
    assert not result.ok
    assert [r.exit_code for r in result.ranks] == [0, 3]
    assert "rank 0 says hello" in result.ranks[0].output
    assert "rank 1 says hello" in result.ranks[1].output
    assert "rank 0 says hello" not in result.ranks[1].output
    with pytest.raises(LaunchError, match=r"rank 1 \(its script exited 3\)"):
        result.check()


def test_a_crash_in_native_code_leaves_the_python_stacks_in_the_ranks_output():
    result = launch("native_crash.py")
    assert not result.ok and result.returncode != 0
    crashed = result.ranks[1]
    assert crashed.exit_code is None
    assert "rank 1 crashes now" in crashed.output
    assert "Fatal Python error: Aborted" in crashed.output
    assert "in crash_in_native_code" in crashed.output
    with pytest.raises(LaunchError, match=r"rank 1 \(its script did not return\)"):
        result.check()


def test_a_hung_collective_is_killed_and_reported():
    started = time.monotonic()
    result = launch("hang.py", timeout=15)
    assert time.monotonic() - started < 60
    assert result.timed_out and not result.ok
    assert [r.exit_code for r in result.ranks] == [None, None]
    assert "rank 1 started" in result.ranks[1].output
    with pytest.raises(LaunchError, match="timed out"):
        result.check()


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="controller"):
        run_workers(tmp_path / "x.py", controller="tcp")
    with pytest.raises(FileNotFoundError, match="worker script not found"):
        run_workers(tmp_path / "missing.py")

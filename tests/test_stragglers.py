"""hvdtrain.stragglers: the rule that names a straggler, its line, the JSON record, the
report rank 0 keeps, and ``hvdtrain report`` over a metrics file (the real launches are
in tests/test_step_timing.py)."""

from __future__ import annotations

import io
import json

import pytest

from hvdtrain.jobs.cli import main
from hvdtrain.stragglers import (
    EXCESS_SHARE,
    MIN_EXCESS_SECONDS,
    RankTimes,
    StragglerReport,
    TimingWindow,
    find_straggler,
    merge,
    read_records,
    straggler_line,
)


def window(computes: list[float], reductions: list[float] | None = None, steps: int = 50,
           seconds: float = 2.0, size: int | None = None) -> TimingWindow:
    """A window whose ranks computed ``computes`` seconds per step; by default each waits
    for the slowest, on top of 1 ms of communication."""
    if reductions is None:
        reductions = [0.001 + max(computes) - c for c in computes]
    return TimingWindow(
        ranks=tuple(RankTimes(r, f"host-{r}", c, d, steps, 8.0)
                    for r, (c, d) in enumerate(zip(computes, reductions, strict=True))),
        world_size=size or len(computes), seconds=seconds, time=1000.0)


def test_the_slowest_rank_is_named_with_what_it_costs_the_others():
    straggler = find_straggler(window([0.020, 0.022, 0.041, 0.021]))
    assert (straggler.rank, straggler.host) == (2, "host-2")
    assert straggler.others_compute_s == pytest.approx(0.021)
    assert straggler.excess_s == pytest.approx(0.020)
    assert straggler.others_wait_s == pytest.approx(0.020)
    # the step: the median of compute + reduction, 42 ms on every rank here
    assert straggler.share_of_step == pytest.approx(0.020 / 0.042)
    line = straggler_line(straggler, ", over the last 60 s")
    assert line == ("hvdtrain: rank 2 (host-2) is the straggler: 41.0 ms of compute per step "
                    "against a median of 21.0 ms for the other ranks; the other ranks wait "
                    "20.0 ms per step for it (48 % of the step), over the last 60 s")


@pytest.mark.parametrize(("excess_share", "named"), [(EXCESS_SHARE * 0.9, False),
                                                     (EXCESS_SHARE * 1.1, True)])
def test_a_rank_is_named_only_beyond_the_documented_share(excess_share, named):
    base = 0.050  # 50 ms: the share, not the 1 ms floor, decides
    assert (find_straggler(window([base, base * (1 + excess_share), base])) is not None) == named


def test_a_small_excess_on_a_short_step_is_noise():
    base = 0.002  # 2 ms steps: 50 % more is 1 ms, at the floor
    assert find_straggler(window([base, base + MIN_EXCESS_SECONDS * 0.9])) is None
    assert find_straggler(window([base, base + MIN_EXCESS_SECONDS * 1.1])) is not None


def test_even_ranks_and_a_lone_rank_have_no_straggler():
    assert find_straggler(window([0.020, 0.0205, 0.0198])) is None
    assert find_straggler(window([0.5], size=2)) is None  # the other rank has joined


def test_with_two_ranks_the_other_rank_is_the_baseline():
    straggler = find_straggler(window([0.010, 0.040]))
    assert straggler.rank == 1 and straggler.excess_s == pytest.approx(0.030)


def test_the_communication_is_the_shortest_reduction_and_waits_are_beyond_it():
    times = window([0.010, 0.030], reductions=[0.025, 0.004])
    assert times.communication_s == pytest.approx(0.004)
    assert [times.wait_s(t) for t in times.ranks] == pytest.approx([0.021, 0.0])
    assert times.steps_per_second == pytest.approx(25.0)
    assert times.samples_per_second == pytest.approx(25.0 * 16)


def test_a_record_reads_back_as_the_window_it_describes():
    times = window([0.0123456, 0.0301], reductions=[0.0191, 0.0013])
    record = json.loads(json.dumps(times.record()))
    assert record["straggler"] == 1 and record["world_size"] == 2
    assert record["ranks"][0] == {"rank": 0, "host": "host-0", "compute_ms": 12.346,
                                  "wait_ms": 17.8, "reduction_ms": 19.1, "steps": 50}
    again = TimingWindow.from_record(record)
    assert [t.compute_s for t in again.ranks] == pytest.approx([0.012346, 0.0301])
    assert find_straggler(again).rank == 1


def test_scalars_name_the_median_the_slowest_and_each_rank():
    numbers = window([0.010, 0.011, 0.040]).scalars(per_rank=True)
    assert numbers["step_compute_ms"] == 11.0
    assert numbers["slowest_rank"] == 2 and numbers["straggler"] == 2
    assert numbers["rank2_wait_ms"] == 0.0 and numbers["rank0_wait_ms"] == 30.0
    assert window([0.010, 0.010]).scalars()["straggler"] == -1


def test_merge_weights_each_window_by_its_steps():
    first = window([0.010, 0.020], steps=10, seconds=1.0)
    second = window([0.010, 0.050], steps=30, seconds=3.0)
    run = merge([first, second])
    assert run.seconds == 4.0 and run.steps == 40
    assert run.ranks[1].compute_s == pytest.approx((0.020 * 10 + 0.050 * 30) / 40)
    assert merge([]) is None


def test_the_report_prints_a_line_per_window_with_a_straggler_and_appends_records(tmp_path):
    output, metrics = io.StringIO(), tmp_path / "run.jsonl"
    report = StragglerReport(output=output, metrics_path=metrics)
    report.window(window([0.010, 0.040]))
    report.window(window([0.010, 0.010]))
    report.window(window([0.010, 0.040]))
    lines = output.getvalue().splitlines()
    assert len(lines) == 2 and all("rank 1 (host-1) is the straggler" in ln for ln in lines)
    assert lines[0].endswith(", over the last 2 s")
    assert [r["straggler"] for r in read_records(metrics)] == [1, None, 1]
    report.finish()
    assert output.getvalue().splitlines()[-1].endswith(", over 6 s of training (150 steps)")


def test_without_lines_only_the_file_is_written(tmp_path):
    output = io.StringIO()
    report = StragglerReport(output=output, metrics_path=tmp_path / "r.jsonl", lines=False)
    report.window(window([0.010, 0.040]))
    report.finish()
    assert output.getvalue() == "" and len(list(read_records(tmp_path / "r.jsonl"))) == 1


def test_an_elastic_change_of_size_starts_the_run_anew():
    output = io.StringIO()
    report = StragglerReport(output=output)
    report.window(window([0.010, 0.040, 0.010]))
    report.window(window([0.010, 0.010]))  # the slow worker left
    output.truncate(0)
    output.seek(0)
    report.finish()
    assert output.getvalue() == ""


def write_records(path, windows) -> None:
    path.write_text("".join(json.dumps(w.record()) + "\n" for w in windows))


def test_hvdtrain_report_prints_a_row_per_rank_and_the_straggler(tmp_path, capsys):
    path = tmp_path / "run.jsonl"
    write_records(path, [window([0.010, 0.011, 0.040]), window([0.010, 0.011, 0.041])])
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 windows over 4 s of training, 100 steps, world size 3; "
                          "median 25.0 steps/s, 600 samples/s")
    assert "   2  host-2                     40.5      0.0          1.0     100  2 of 2 windows" \
        in out
    assert "hvdtrain: rank 2 (host-2) is the straggler" in out


def test_hvdtrain_report_says_which_line_is_not_a_record(tmp_path, capsys):
    path = tmp_path / "run.jsonl"
    write_records(path, [window([0.010, 0.011])])
    with path.open("a") as file:
        file.write('{"time": 1}\n')
    assert main(["report", str(path)]) == 2
    error = capsys.readouterr().err
    assert "line 2: not an hvdtrain metrics record" in error
    assert "HVDTRAIN_METRICS_FILE" in error
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 2
    assert "No such file" in capsys.readouterr().err


def test_hvdtrain_report_on_an_empty_file_says_when_records_come(tmp_path, capsys):
    path = tmp_path / "run.jsonl"
    path.write_text("")
    assert main(["report", str(path)]) == 2
    assert "holds no records" in capsys.readouterr().err

"""average_metrics, distributed_sampler (hvdtrain/adapters/torch/data.py)
on 2 real ranks (Gloo and MPI).

The launch, shared by tests/adapters/test_torch_*.py: conftest.py's ``torch_run``.
"""

import pytest


def test_average_metrics_and_sampler(torch_run):
    rank0, rank1 = torch_run.both("metrics")
    expected = {"loss": (1.0 + 2.0) / 2, "accuracy": (0.0 + 0.25) / 2}
    assert rank0["averaged"] == rank1["averaged"] == pytest.approx(expected)
    for report in (rank0, rank1):
        assert "['loss'] on rank 0 but ['los'] on rank 1" in report["key_error"]
    for epoch in (0, 1):
        shares = rank0["sampler"][epoch] + rank1["sampler"][epoch]
        assert sorted(shares) == list(range(10))
    assert rank0["sampler"][0] != rank0["sampler"][1]

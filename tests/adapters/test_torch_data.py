"""average_metrics, distributed_sampler (hvdtrain/adapters/torch/data.py)
on 2 real ranks (Gloo and MPI).

The launch, shared by tests/adapters/test_torch_*.py: conftest.py's ``torch_run``.
"""

import pytest
import torch


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


def test_uneven_evaluation_counts_every_example_once_and_averages_like_one_process(torch_run):
    """21 examples on 2 ranks with distributed_sampler(pad=False): 11 + 10, no repeats;
    average_metrics(examples=) equals one process evaluating all 21, the plain mean
    of the two ranks' means does not."""
    rank0, rank1 = (report["uneven"] for report in torch_run.both("metrics"))
    assert (rank0["length"], rank1["length"]) == (11, 10)
    assert sorted(rank0["indices"] + rank1["indices"]) == list(range(21))
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(21, 3, generator=generator, dtype=torch.float64)
    y = (x.sum(1) > 0).long()
    logits = x @ torch.tensor([[0.3, -0.2, 0.1], [-0.1, 0.4, 0.2]], dtype=torch.float64).T
    expected = {"loss": torch.nn.functional.cross_entropy(logits, y).item(),
                "accuracy": (logits.argmax(1) == y).double().mean().item()}
    for report in (rank0, rank1):
        assert report["weighted"] == pytest.approx(expected, rel=1e-12)
    assert rank0["unweighted"]["loss"] != pytest.approx(expected["loss"], rel=1e-6)

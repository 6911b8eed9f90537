"""broadcast_state, verify_replicas, state_fingerprint (hvdtrain/adapters/torch/replicas.py)
on 2 real ranks (Gloo and MPI).

The launch, shared by tests/adapters/test_torch_*.py: conftest.py's ``torch_run``.
"""

import torch
from workers.torch_common import make_model

import hvdtrain.adapters.torch as hvt


def test_broadcast_state_from_different_seeds(torch_run):
    rank0, rank1 = torch_run.both("broadcast_state")
    assert rank0["before"] != rank1["before"]
    assert rank0["after"] == rank0["before"] == rank1["after"]
    assert rank0["identical"] and rank1["identical"]  # verify_replicas, Adam state included
    assert rank1["adam_state_entries"] == rank0["adam_state_entries"] == 4
    assert rank1["extra"] == rank0["extra"] == {"epoch": 3, "seed": 41}
    assert rank1["last_lr"] == rank0["last_lr"] == [0.01 * 0.5**3]


def test_broadcast_state_creates_no_state_and_leaves_the_weights(torch_run):
    rank0, rank1 = torch_run.both("broadcast_fresh")
    assert rank0["after"] == rank0["before"] == rank1["after"] != rank1["before"]
    assert rank0["state_entries"] == rank1["state_entries"] == 0


def test_verify_replicas_names_the_rank_and_tensor(torch_run):
    for report in torch_run.both("verify_replicas"):
        assert "rank(s) [1]" in report["message"]
        assert "model.2.bias" in report["message"]


def test_state_fingerprint_is_equal_exactly_for_bit_identical_states():
    """One process: the fingerprint is local (no collective), so no launch is needed."""
    model, twin = make_model(seed=7), make_model(seed=7)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    twin_optimizer = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    assert hvt.state_fingerprint(model, optimizer) == hvt.state_fingerprint(twin, twin_optimizer)
    with torch.no_grad():
        twin[2].bias[1] += 1e-12
    assert hvt.state_fingerprint(model) != hvt.state_fingerprint(twin)
    twin_optimizer.param_groups[0]["lr"] = 0.2
    assert hvt.state_fingerprint(model, optimizer) != hvt.state_fingerprint(
        make_model(seed=7), twin_optimizer)

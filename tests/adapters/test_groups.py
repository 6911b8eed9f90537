"""Several independent data-parallel groups in one job: 4 MPI ranks as 2 groups of 2.

Each adapter's init(comm=...) takes an mpi4py sub-communicator; within a group the
replicas must agree, and the two groups (trained on different data) must differ.
"""

import pytest
from harness import launch, reports


@pytest.mark.parametrize("framework", ["torch", "keras", "numpy"])
def test_two_groups_of_two_train_independently(framework):
    result = launch("groups.py", framework, controller="mpi", np=4, timeout=180).check()
    by_world_rank = {r["world_rank"]: r for r in reports(result)}
    assert sorted(by_world_rank) == [0, 1, 2, 3]
    for world_rank, report in by_world_rank.items():
        assert report["group"] == world_rank // 2
        assert report["rank"] == world_rank % 2 and report["size"] == 2
    assert by_world_rank[0]["weights"] == by_world_rank[1]["weights"]
    assert by_world_rank[2]["weights"] == by_world_rank[3]["weights"]
    assert by_world_rank[0]["weights"] != by_world_rank[2]["weights"]

"""hvdtrain.collective, the seam between the core and the frameworks, and the core
functions that take a Collective (agreement, replica checks, metrics), in one process
over a scripted group of pretend ranks. The adapters' own Collectives are exercised
by every multi-rank launch (tests/adapters/)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from hvdtrain import watchdog
from hvdtrain.collective import any_rank, gather, on_rank0_for_all, require_initialized
from hvdtrain.consistency import RankDisagreementError, check_ranks_agree
from hvdtrain.metrics import average_over_ranks
from hvdtrain.replicas import ReplicaMismatchError, checksums, verify_checksums


class ScriptedGroup:
    """This process as ``rank`` of a group whose other ranks' values are given: their
    allgather contributions (``others``) and rank 0's broadcast (``from_rank_0``).
    Records each collective's name."""

    init_call = "hvx.init()"

    def __init__(self, rank: int = 0, others: list[Any] | None = None,
                 from_rank_0: Any = None, initialized: bool = True) -> None:
        self._rank, self.others, self.from_rank_0 = rank, others or [], from_rank_0
        self.initialized, self.names = initialized, []

    def is_initialized(self) -> bool:
        return self.initialized

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return 1 + len(self.others)

    def allgather_object(self, value: Any, name: str) -> list[Any]:
        self.names.append(name)
        everyone = list(self.others)
        everyone.insert(self._rank, value)
        return everyone

    def broadcast_object(self, value: Any, root_rank: int, name: str) -> Any:
        self.names.append(name)
        return value if self._rank == root_rank else self.from_rank_0


def test_require_initialized_names_the_caller_and_the_init_to_call():
    require_initialized(ScriptedGroup(), "anything")
    with pytest.raises(RuntimeError, match=r"^verify_replicas needs the workers connected: "
                                           r"call hvx\.init\(\) first$"):
        require_initialized(ScriptedGroup(initialized=False), "verify_replicas")


def test_gather_passes_the_name_and_is_watched(tmp_path, monkeypatch):
    dog = watchdog.Watchdog(0, 2, 5.0, poll_s=0.05, stream=(tmp_path / "r.txt").open("w"),
                            on_expiry=threading.Event().set)
    monkeypatch.setattr(watchdog, "_active", dog)
    seen = []

    class Watched(ScriptedGroup):
        def allgather_object(self, value, name):
            seen.append(dog.oldest_wait()[0])
            return super().allgather_object(value, name)

    group = Watched(others=[3])
    assert gather(group, 3, "hvdtrain.test") == [3, 3]
    assert group.names == ["hvdtrain.test"]
    assert seen == ["the allgather of hvdtrain.test"]
    assert dog.oldest_wait() is None
    dog.stop()


def test_on_rank0_for_all_raises_rank_0s_failure_on_every_rank():
    def broken() -> None:
        raise OSError("disk full")

    with pytest.raises(RuntimeError, match="rank 0 could not write x: OSError: disk full"):
        on_rank0_for_all(ScriptedGroup(rank=0), broken, "write x", "hvdtrain.test")
    rank1 = ScriptedGroup(rank=1, others=[None], from_rank_0="OSError: disk full")
    with pytest.raises(RuntimeError, match="rank 0 could not write x: OSError: disk full"):
        on_rank0_for_all(rank1, lambda: pytest.fail("only rank 0 acts"), "write x",
                         "hvdtrain.test")
    assert rank1.names == ["hvdtrain.test"]
    assert on_rank0_for_all(ScriptedGroup(rank=0), lambda: 7, "read x", "n") == 7
    assert on_rank0_for_all(ScriptedGroup(rank=1, others=[None]), lambda: 7, "read x",
                            "n") is None


def test_check_ranks_agree_gathers_under_the_given_name_and_raises_on_a_difference():
    group = ScriptedGroup(others=[{"lr": 0.1}])
    check_ranks_agree(group, {"lr": 0.1}, "Here", name="hvdtrain.test")
    assert group.names == ["hvdtrain.test"]
    with pytest.raises(RankDisagreementError, match=r"Here: the ranks disagree: lr is 0\.1 on "
                                                    r"rank 0 but 0\.2 on rank 1"):
        check_ranks_agree(ScriptedGroup(others=[{"lr": 0.2}]), {"lr": 0.1}, "Here")


def test_verify_checksums_names_the_rank_that_differs():
    mine = checksums({"w": np.zeros(3)})
    verify_checksums(ScriptedGroup(others=[mine]), mine)
    with pytest.raises(ReplicaMismatchError, match=r"rank\(s\) \[1\] disagree with rank 0"):
        verify_checksums(ScriptedGroup(others=[checksums({"w": np.ones(3)})]), mine)


def test_average_over_ranks_weights_by_examples_when_given():
    assert average_over_ranks(ScriptedGroup(others=[({"loss": 3.0}, None)]),
                              {"loss": 1}) == {"loss": 2.0}
    group = ScriptedGroup(others=[({"loss": 3.0}, {"loss": 3})])
    assert average_over_ranks(group, {"loss": 1.0}, {"loss": 1}) == {"loss": 2.5}
    assert group.names == ["hvdtrain.metrics"]


class OtherRanks:
    """The part of a TensorCollective the vote uses, for one process: the sum adds the
    flags of the other ranks given. The adapters' own tensors() are checked on real
    ranks (test_torch_optimizer.py, test_keras_optimizer.py, test_numpy.py)."""

    def __init__(self, *flags: float) -> None:
        self.flags = flags

    def allreduce(self, tensor, name, *, op="sum", prescale=1.0, postscale=1.0):
        assert op == "sum" and name == "vote"
        return tensor + sum(self.flags)

    def wait(self, handle):
        return handle


def test_the_vote_is_any_rank():
    assert any_rank(np.array([1.0]), OtherRanks(0.0), "vote").tolist() == [True]
    assert any_rank(np.array([0.0]), OtherRanks(0.0, 0.0), "vote").tolist() == [False]
    # another rank raised its flag
    assert any_rank(np.array([0.0]), OtherRanks(0.0, 1.0), "vote").tolist() == [True]

"""hvdtrain.consistency: which field differs, on which rank, with both values."""

import pytest

from hvdtrain.consistency import (
    RankDisagreementError,
    first_fact_difference,
    first_parameter_difference,
    raise_on_disagreement,
    software_versions,
)


def test_agreeing_ranks_pass():
    facts = {"batch": 32, "optimizer": "SGD"}
    assert first_fact_difference([facts, dict(facts), dict(facts)]) is None
    raise_on_disagreement([facts, facts], "here")


def test_the_first_differing_field_is_named_with_rank_and_both_values():
    ranks = [{"batch": 32, "optimizer": "SGD"}, {"batch": 32, "optimizer": "SGD"},
             {"batch": 16, "optimizer": "Adam"}]
    assert first_fact_difference(ranks) == "batch is 32 on rank 0 but 16 on rank 2"
    with pytest.raises(RankDisagreementError, match=r"^Where: the ranks disagree: batch"):
        raise_on_disagreement(ranks, "Where")


def test_a_field_missing_on_one_rank_counts():
    assert (first_fact_difference([{"a": 1}, {"a": 1, "b": 2}])
            == "b is None on rank 0 but 2 on rank 1")


def test_versions_name_python_hvdtrain_and_absent_packages():
    versions = software_versions("numpy", "no-such-distribution")
    assert set(versions) == {"python", "hvdtrain", "numpy", "no-such-distribution"}
    assert versions["no-such-distribution"] == "absent"


MODEL = [("fc.weight", (4, 3), "float64"), ("fc.bias", (4,), "float64")]


@pytest.mark.parametrize(("other", "expected"), [
    (MODEL, None),
    ([("fc.weight", (5, 3), "float64"), MODEL[1]],
     "parameter 'fc.weight' has shape (4, 3) on rank 0 but (5, 3) on rank 1"),
    ([("fc.weight", (4, 3), "float32"), MODEL[1]],
     "parameter 'fc.weight' has dtype float64 on rank 0 but float32 on rank 1"),
    (MODEL[:1], "rank 1 has no parameter 'fc.bias', which rank 0 has"),
    ([*MODEL, ("extra", (1,), "float64")], "rank 1 has parameter 'extra', which rank 0 lacks"),
    (MODEL[::-1], "rank 1 lists the parameters in a different order than rank 0"),
])
def test_first_parameter_difference_names_rank_parameter_and_both_values(other, expected):
    assert first_parameter_difference([MODEL, other]) == expected

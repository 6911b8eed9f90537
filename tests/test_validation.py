"""hvdtrain.validation: each check refuses what is wrong, saying which argument, what it
got and what it takes, and lets every valid value through."""

import math

import pytest

from hvdtrain.validation import (
    is_finite_number,
    require_compression,
    require_instance,
    require_non_negative_int,
    require_positive_int,
    require_positive_number,
    require_root_rank,
    require_same_world_size,
)


@pytest.mark.parametrize(("value", "finite"), [
    (1, True), (0.5, True), (-3, True), (True, False), (math.nan, False), (math.inf, False),
    ("1", False), (None, False)])
def test_a_finite_number_is_an_int_or_float_but_not_a_bool(value, finite):
    assert is_finite_number(value) is finite


@pytest.mark.parametrize("bad", [0, -1.5, math.nan, math.inf, True, "2"])
def test_a_positive_number_is_finite_and_above_zero(bad):
    require_positive_number("lr", 0.1)
    with pytest.raises(ValueError, match=rf"lr must be a finite number > 0, got {bad!r}"):
        require_positive_number("lr", bad)


@pytest.mark.parametrize("bad", [0, -2, 1.0, True, None])
def test_a_positive_int_refuses_floats_bools_and_zero(bad):
    require_positive_int("backward_passes_per_step", 3)
    with pytest.raises(ValueError, match=r"backward_passes_per_step must be an int > 0, got "):
        require_positive_int("backward_passes_per_step", bad)


def test_a_non_negative_int_takes_zero():
    require_non_negative_int("epochs", 0)
    with pytest.raises(ValueError, match=r"epochs must be an int >= 0, got -1"):
        require_non_negative_int("epochs", -1)


@pytest.mark.parametrize("bad", [-1, 2, 1.0, True])
def test_a_root_rank_names_one_of_the_workers(bad):
    require_root_rank(1, 2)
    with pytest.raises(ValueError, match=r"root_rank must be an int in \[0, 2\) for 2 workers"):
        require_root_rank(bad, 2)


def test_an_explicit_world_size_must_be_the_launchers():
    require_same_world_size(4, 4, "hvt.size()")
    with pytest.raises(ValueError, match=r"world_size=2 contradicts the launcher's 4"):
        require_same_world_size(2, 4, "hvt.size()")


def test_an_instance_check_names_the_argument_and_the_type_it_got():
    require_instance("sampler", [], list, "a list")
    with pytest.raises(TypeError, match=r"sampler must be a list, got dict"):
        require_instance("sampler", {}, list, "a list")


@pytest.mark.parametrize("good", [None, "fp16", "bf16"])
def test_compression_takes_the_wire_formats(good):
    require_compression(good)


def test_compression_refuses_anything_else_naming_the_choices():
    with pytest.raises(ValueError, match=r"compression must be None, 'fp16' or 'bf16', got 'gzip'"):
        require_compression("gzip")

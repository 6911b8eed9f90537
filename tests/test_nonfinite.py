"""hvdtrain.nonfinite: the policy every adapter follows for a non-finite gradient, and
the one message it gives."""

import pytest

from hvdtrain.nonfinite import (
    PLAIN_REMEDY,
    NonFiniteGradientError,
    NonFinitePolicy,
    nonfinite_gradient_message,
)


def test_the_message_names_parameter_and_step_and_says_what_to_do():
    message = nonfinite_gradient_message(7, "fc.weight")
    assert message.startswith("the worker-averaged gradient of 'fc.weight' holds NaN or Inf at "
                              "optimizer step 7 (counting from 0)")
    assert "skip_nonfinite=True" in message


def test_without_a_parameter_or_a_skip_option_the_message_says_less():
    message = nonfinite_gradient_message(0, remedy=PLAIN_REMEDY)
    assert message.startswith("the worker-averaged gradient holds NaN or Inf at optimizer step 0")
    assert message.endswith(PLAIN_REMEDY) and "skip_nonfinite" not in message


def test_the_error_is_a_floating_point_error():
    assert issubclass(NonFiniteGradientError, FloatingPointError)


@pytest.mark.parametrize(("skip", "check", "policy"), [
    (True, True, NonFinitePolicy.SKIP), (True, False, NonFinitePolicy.SKIP),
    (False, True, NonFinitePolicy.RAISE), (False, False, NonFinitePolicy.IGNORE)])
def test_the_two_arguments_make_one_policy(skip, check, policy):
    assert NonFinitePolicy.of(skip, check) is policy
    assert policy.checks is (policy is not NonFinitePolicy.IGNORE)
    assert policy.skips is (policy is NonFinitePolicy.SKIP)
    assert NonFinitePolicy(policy.value) is policy and policy == policy.value

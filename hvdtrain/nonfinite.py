"""What every adapter does when a worker-averaged gradient is not finite: the policy
(:class:`NonFinitePolicy`: raise, skip, ignore) and the error it raises.

A NaN or Inf in one rank's gradient spreads to every rank through the allreduce, so
each adapter checks the averaged gradient after the allreduce (the same values on every
rank, so every rank stops alike) and raises :class:`NonFiniteGradientError` with the
message of :func:`nonfinite_gradient_message`.

Example::

    from hvdtrain.nonfinite import nonfinite_gradient_message

    nonfinite_gradient_message(7, "fc.weight")
    # "the worker-averaged gradient of 'fc.weight' holds NaN or Inf at optimizer step 7 ..."
"""

from __future__ import annotations

import enum

SKIP_REMEDY = ("Lower the learning rate, check the data, or pass skip_nonfinite=True to skip "
               "such steps on every rank.")
PLAIN_REMEDY = "Lower the learning rate or check the data."
TAPE_REMEDY = ("Lower the learning rate or check the data (or pass check_nonfinite=False to "
               "DistributedGradientTape to let it through).")


class NonFiniteGradientError(FloatingPointError):
    """The worker-averaged gradient holds a NaN or Inf (and ``skip_nonfinite`` is off)."""


def nonfinite_gradient_message(step: object, parameter: str | None = None,
                               remedy: str = SKIP_REMEDY) -> str:
    """What went wrong, where, and what to do.

    Args:
        step: the optimizer step, counting from 0 (anything that prints as it; a
            graph adapter may pass a placeholder and splice the runtime value in).
        parameter: the parameter whose gradient is not finite, when known.
        remedy: the advice that ends the message.

    Returns:
        The message, one sentence of cause and one of remedy.
    """
    of = f" of {parameter!r}" if parameter is not None else ""
    return (f"the worker-averaged gradient{of} holds NaN or Inf at optimizer step {step} "
            f"(counting from 0); some rank's loss or gradient went non-finite. {remedy}")


class NonFinitePolicy(enum.StrEnum):
    """What every adapter does when a worker-averaged gradient holds NaN or Inf; the
    same values on every rank, so every rank does the same.

    Users pass ``skip_nonfinite`` and ``check_nonfinite`` (:meth:`of`).
    """

    RAISE = "raise"
    """Stop training on every rank with the non-finite gradient error."""
    SKIP = "skip"
    """Skip the update on every rank (a NaN or Inf on any rank skips it everywhere) and
    count it."""
    IGNORE = "ignore"
    """Apply the update as it is (Horovod's behaviour): no check."""

    @classmethod
    def of(cls, skip_nonfinite: bool, check_nonfinite: bool) -> NonFinitePolicy:
        """The policy of the adapters' two arguments; skipping implies checking."""
        if skip_nonfinite:
            return cls.SKIP
        return cls.RAISE if check_nonfinite else cls.IGNORE

    @property
    def checks(self) -> bool:
        """Whether the averaged gradients are checked at all."""
        return self is not NonFinitePolicy.IGNORE

    @property
    def skips(self) -> bool:
        """Whether a non-finite step is skipped rather than raised."""
        return self is NonFinitePolicy.SKIP

"""The formats gradients travel in: the ``compression`` argument of every adapter
(None, "fp16", "bf16"), each a :class:`WireFormat` with its dtype on the wire, its largest
number (the limit of the tally's finiteness proof) and the Horovod patch that reduces
it (framework-free; each adapter maps these to its framework's casts).

>>> wire_format("fp16").largest
65504.0
>>> wire_format(None).largest_for(3.0)
3.0
"""

from __future__ import annotations

from dataclasses import dataclass

from hvdtrain import horovod_patches


@dataclass(frozen=True)
class WireFormat:
    """A format gradients travel in (hvdtrain's ``compression`` argument).

    Attributes:
        name: the ``compression`` value (None: the gradients' own dtype).
        dtype: the dtype on the wire, or None for the gradients' own.
        largest: the largest finite number on the wire, or None for the gradients' own
            dtype's.
        needs_patch: the hvdtrain patch to Horovod that reduces it (None: every Horovod
            does); on a Horovod without it the format travels through Horovod's allgather
            and is added up on every rank in rank order.
    """

    name: str | None
    dtype: str | None
    largest: float | None
    needs_patch: str | None = None

    @property
    def reduced_natively(self) -> bool:
        """Whether the installed Horovod reduces this format in its allreduce."""
        return self.needs_patch is None or horovod_patches.has_patch(self.needs_patch)

    @property
    def bytes_per_element(self) -> int | None:
        """The bytes one element takes on the wire (None: the gradients' own size)."""
        return None if self.dtype is None else 2

    def largest_for(self, gradient_largest: float) -> float:
        """The largest finite number on the wire for gradients whose dtype's is
        ``gradient_largest``."""
        return gradient_largest if self.largest is None else min(self.largest,
                                                                  gradient_largest)


WIRE_FORMATS: dict[str | None, WireFormat] = {
    None: WireFormat(None, None, None),
    "fp16": WireFormat("fp16", "float16", 65504.0),
    "bf16": WireFormat("bf16", "bfloat16", 3.3895313892515355e38,
                       needs_patch=horovod_patches.BFLOAT16),
}
"""Every ``compression`` hvdtrain accepts, by name."""


def require_bfloat16_reduction(what: str) -> None:
    """Raise RuntimeError, saying how to get it, when the installed Horovod cannot reduce
    bfloat16 (it lacks hvdtrain's patch 0011-bfloat16) and ``what`` needs it to."""
    if not WIRE_FORMATS["bf16"].reduced_natively:
        raise RuntimeError(horovod_patches.missing_patch_message(
            what, horovod_patches.BFLOAT16, "Horovod 0.28.1 has no bfloat16 reduction"))


def wire_format(name: object) -> WireFormat:
    """The wire format called ``name``; ValueError naming the choices for anything else."""
    try:
        return WIRE_FORMATS[name]  # type: ignore[index]
    except (KeyError, TypeError):
        *first, last = (repr(known) for known in WIRE_FORMATS)
        raise ValueError(f"compression must be {', '.join(first)} or {last}, got {name!r}"
                         ) from None

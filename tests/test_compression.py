"""hvdtrain.compression: the formats gradients travel in."""

import numpy as np
import pytest

from hvdtrain import horovod_patches
from hvdtrain.compression import WIRE_FORMATS, wire_format

LARGEST32 = float(np.finfo(np.float32).max)


def test_the_wire_formats_and_their_largest_numbers():
    assert list(WIRE_FORMATS) == [None, "fp16", "bf16"]
    assert wire_format("fp16").largest == float(np.finfo(np.float16).max)
    assert wire_format("fp16").largest_for(LARGEST32) == 65504.0
    assert wire_format(None).largest_for(LARGEST32) == LARGEST32
    assert wire_format("bf16").largest < LARGEST32
    assert wire_format("bf16").bytes_per_element == 2 and wire_format(None).bytes_per_element \
        is None
    assert wire_format("fp16").reduced_natively and wire_format(None).reduced_natively
    # bf16 is reduced natively exactly when the installed Horovod carries patch 0011
    assert wire_format("bf16").needs_patch == horovod_patches.BFLOAT16
    assert wire_format("bf16").reduced_natively == horovod_patches.has_patch(
        horovod_patches.BFLOAT16)


@pytest.mark.parametrize("bad", ["zip", 16, ["fp16"]])
def test_an_unknown_wire_format_is_refused_naming_the_choices(bad):
    with pytest.raises(ValueError, match=r"compression must be None, 'fp16' or 'bf16', got "):
        wire_format(bad)

"""hvdtrain.allocator: freed memory stays in the process, and the user's choice wins."""

import json
import os
import subprocess
import sys

import pytest

from hvdtrain import allocator

# A step's pattern: large buffers of several sizes, touched, freed, again. The faults of
# the last rounds are what each later training step would pay.
_STEPS = """
import json, resource, sys
import numpy as np
from hvdtrain import allocator, runtime
applied = allocator.keep_freed_memory() if sys.argv[1] == "keep" else False
if sys.argv[1] == "init":  # what every adapter's init() runs
    runtime.apply_runtime_defaults(accelerator=False)
sizes = [int(n) for n in sys.argv[2].split(",")] if len(sys.argv) > 2 else [3, 20, 7, 20, 12]  # MiB
def step():
    buffers = [np.ones(n * 1024 * 256, dtype=np.float32) for n in sizes]
    del buffers
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(json.dumps({"applied": applied,
                  "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _faults(mode: str, *sizes: int, **environ: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _STEPS, mode,
                           *([",".join(map(str, sizes))] if sizes else [])], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **environ}, check=True)
    return json.loads(done.stdout)


@pytest.mark.timeout(120)
def test_freed_buffers_are_reused_without_page_faults():
    plain = _faults("plain")
    kept = _faults("keep")
    assert kept["applied"] is True
    # 62 MiB touched per step is about 16,000 pages; glibc returns most of it by default.
    assert plain["faults"] > 5_000, plain
    assert kept["faults"] < plain["faults"] / 20, (kept, plain)
    assert _faults("init")["faults"] < plain["faults"] / 20


@pytest.mark.timeout(120)
@pytest.mark.parametrize("environ", [{allocator.SWITCH: "0"},
                                     {"MALLOC_TRIM_THRESHOLD_": "131072"}])
def test_the_switch_and_glibcs_own_variables_leave_the_allocator_alone(environ):
    assert _faults("keep", **environ)["applied"] is False


@pytest.mark.timeout(120)
def test_all_keeps_blocks_above_glibcs_largest_mmap_threshold_too():
    """Blocks above 32 MiB are mapped afresh on every allocation by default (each step
    faults them in again); with HVDTRAIN_KEEP_FREED_MEMORY=all they come from the heap
    and are reused."""
    large = (40, 64, 48)  # MiB per step
    default = _faults("keep", *large)
    kept = _faults("keep", *large, **{allocator.SWITCH: allocator.ALL})
    assert default["applied"] is True and kept["applied"] is True
    # NumPy asks for huge pages on arrays this large, hence far fewer faults than 4 KiB
    # pages would take (about 8,000 here for the 5 steps).
    assert default["faults"] > 1_000, default
    assert kept["faults"] < default["faults"] / 20, (kept, default)


def test_a_value_of_the_switch_that_is_no_choice_is_refused(monkeypatch):
    monkeypatch.setenv(allocator.SWITCH, "yes")
    with pytest.raises(ValueError, match="HVDTRAIN_KEEP_FREED_MEMORY='yes' is not a choice"):
        allocator.keep_freed_memory(_Libc())


class _Libc:
    def __init__(self, answer: int = 1):
        self.calls, self.answer = [], answer

    def mallopt(self, parameter: int, value: int) -> int:
        self.calls.append((parameter, value))
        return self.answer


def test_sets_the_three_limits_and_reports_a_refusal(monkeypatch):
    for name in (allocator.SWITCH, *allocator.GLIBC_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    libc = _Libc()
    assert allocator.keep_freed_memory(libc) is True
    assert sorted(libc.calls) == sorted([(-3, allocator.MMAP_THRESHOLD_BYTES),
                                         (-1, allocator.TRIM_THRESHOLD_BYTES),
                                         (-2, allocator.TOP_PAD_BYTES)])
    assert allocator.keep_freed_memory(_Libc(answer=0)) is False
    assert allocator.keep_freed_memory(object()) is False  # a C library without mallopt
    monkeypatch.setenv(allocator.SWITCH, "all")
    libc = _Libc()
    assert allocator.keep_freed_memory(libc) is True
    assert (-4, 0) in libc.calls and len(libc.calls) == 4  # M_MMAP_MAX: no mapping at all

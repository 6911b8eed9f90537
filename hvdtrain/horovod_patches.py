"""Which of hvdtrain's patches the installed Horovod carries, and what a missing one costs.

hvdtrain's build of Horovod (``scripts/build-horovod.sh``) applies the patches in
``scripts/patches/horovod/`` and leaves a marker module, ``horovod/hvdtrain_patches.py``,
naming them. A Horovod built any other way (a cluster's own build, a stock wheel) has no
marker. hvdtrain trains correctly on either; on a build without a patch it chooses the
defaults that suit that build (:mod:`hvdtrain.runtime`), refuses what would hang
(``JoinAtEpochEnd`` on TensorFlow without :data:`STATEFUL_JOIN`), and says once, in one
line, what is missing and how to get it (:func:`announce_missing`). ``hvdtrain doctor``
lists each patch.

>>> notice = missing_patches_notice(missing_patches(frozenset()))
>>> notice.startswith("hvdtrain: this Horovod was built without hvdtrain's patches")
True
>>> missing_patches_notice(missing_patches(frozenset(p.name for p in PATCHES))) is None
True
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

MARKER = "hvdtrain_patches.py"
BUILD_COMMAND = "scripts/build-horovod.sh --install"


@dataclass(frozen=True)
class Patch:
    """One of hvdtrain's patches to Horovod.

    Attributes:
        name: its file name in ``scripts/patches/horovod/`` without ``.patch``.
        without: what a Horovod built without it costs, as a clause.
    """

    name: str
    without: str


QUIET_EXTENSION_CHECK = "0001-quiet-extension-check"
IDLE_WAIT = "0002-idle-wait"
BLOCKING_SYNCHRONIZE = "0003-blocking-synchronize"
CACHED_BUILD_CHECKS = "0004-cache-build-checks"
STATEFUL_JOIN = "0005-stateful-join"
ELASTIC_TIMEOUT_TO_WORKERS = "0006-elastic-timeout-to-workers"
GLOO_RING_REDUCESCATTER = "0007-gloo-ring-reducescatter"
MPI_RING_REDUCESCATTER = "0008-mpi-ring-reducescatter"
GLOO_RELEASE_AT_SHUTDOWN = "0009-gloo-release-at-shutdown"
RENDEZVOUS_CLEARS_FINISHED_SCOPES = "0010-rendezvous-clears-finished-scopes"
BFLOAT16 = "0011-bfloat16"

PATCHES: tuple[Patch, ...] = (
    Patch(QUIET_EXTENSION_CHECK, "horovodrun's build check prints TensorFlow's start-up log"),
    Patch(IDLE_WAIT, "idle ranks synchronise every cycle, taking CPU from training (under "
                     "MPI most of a core), and the CPU-only 0.1 ms cycle is not used"),
    Patch(BLOCKING_SYNCHRONIZE, "torch's synchronize() spins on a core while it waits"),
    Patch(CACHED_BUILD_CHECKS, "every horovodrun launch spends seconds importing a "
                               "framework to check the build"),
    Patch(STATEFUL_JOIN, "JoinAtEpochEnd on TensorFlow is refused (TensorFlow would skip "
                         "a rank's second join and the job would hang)"),
    Patch(ELASTIC_TIMEOUT_TO_WORKERS, "an elastic worker bounds its wait for the job to "
                                      "re-form by HOROVOD_ELASTIC_TIMEOUT (default 600 s), "
                                      "not by horovodrun's --elastic-timeout"),
    Patch(GLOO_RING_REDUCESCATTER, "Horovod's Gloo reduce-scatter takes 1.7-5x its allreduce, "
                                   "so shard_gradients=True is slow under Gloo"),
    Patch(MPI_RING_REDUCESCATTER, "Open MPI's reduce-scatter of a large buffer takes 2.7x "
                                  "its allreduce, so shard_gradients=True is slow under MPI "
                                  "on large models"),
    Patch(GLOO_RELEASE_AT_SHUTDOWN, "under Gloo, each rank keeps its connections to the "
                                    "others and two threads after shutdown(), torn down "
                                    "only while the process exits"),
    Patch(RENDEZVOUS_CLEARS_FINISHED_SCOPES, "under Gloo, a worker that calls init() again "
                                             "after shutdown() in the same horovodrun job "
                                             "can abort there (gloo::IoException) when one "
                                             "rank left the last rendezvous later than "
                                             "another"),
    Patch(BFLOAT16, "Horovod reduces no bfloat16: compression='bf16' goes through its "
                    "allgather (fewer bytes than float32 only up to 3 workers) and bfloat16 "
                    "parameters cannot be trained"),
)

# Read once per process (installed()), and announced once per process (announce_missing()).
_installed: frozenset[str] | None = None
_announced = False


def read_marker(horovod_dirs: list[str] | None = None) -> frozenset[str]:
    """The patches named by the marker in the installed Horovod (empty without a marker).

    Horovod itself is not imported. ``horovod_dirs`` are the folders of the ``horovod``
    package (default: where Python finds it).
    """
    if horovod_dirs is None:
        spec = importlib.util.find_spec("horovod")
        horovod_dirs = list(spec.submodule_search_locations or []) if spec else []
    for folder in horovod_dirs:
        marker = Path(folder) / MARKER
        if marker.is_file():
            return frozenset(_marker_patches(marker.read_text()))
    return frozenset()


def _marker_patches(source: str) -> tuple[str, ...]:
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and getattr(node.targets[0], "id", None) == "PATCHES"):
            return tuple(ast.literal_eval(node.value))
    return ()


def installed() -> frozenset[str]:
    """The patches the installed Horovod was built with (read once per process)."""
    global _installed
    if _installed is None:
        _installed = read_marker()
    return _installed


def has_patch(name: str) -> bool:
    """Whether the installed Horovod carries the patch called ``name``."""
    return name in installed()


def missing_patches(present: frozenset[str]) -> tuple[Patch, ...]:
    """hvdtrain's patches that are not in ``present``, in order."""
    return tuple(patch for patch in PATCHES if patch.name not in present)


def missing_patches_notice(missing: tuple[Patch, ...]) -> str | None:
    """The one line a worker prints on a Horovod without some of hvdtrain's patches."""
    if not missing:
        return None
    return ("hvdtrain: this Horovod was built without hvdtrain's patches "
            f"{', '.join(patch.name for patch in missing)}: training is correct, but "
            + "; ".join(patch.without for patch in missing)
            + f". Build and install the patched Horovod with `{BUILD_COMMAND}` from the "
            "hvdtrain checkout; `hvdtrain doctor` lists each patch")


def missing_patch_message(what: str, name: str, consequence: str) -> str:
    """The error for a feature that needs the patch called ``name``, which is missing."""
    return (f"{what} needs hvdtrain's Horovod patch {name}, which the installed Horovod was "
            f"built without: {consequence}. Build and install the patched Horovod with "
            f"`{BUILD_COMMAND}` from the hvdtrain checkout (no root needed)")


def announce_missing(local_rank: int, stream: TextIO | None = None) -> None:
    """Print :func:`missing_patches_notice` once per process, on each host's local rank 0."""
    global _announced
    notice = missing_patches_notice(missing_patches(installed()))
    if notice is None or _announced or local_rank != 0:
        return
    _announced = True
    print(notice, file=stream or sys.stderr, flush=True)

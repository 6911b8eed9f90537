"""Crash-safe checkpoint files, framework-free.

Each adapter's checkpoint format lives with the adapter (the torch one in
:mod:`hvdtrain.adapters.torch.checkpoint`, Keras's in
:mod:`hvdtrain.adapters.keras.checkpoint`); this module holds what they share.
:func:`atomic_write` (or :func:`atomic_path`, for writers that take a path) is what
every adapter's checkpoint writes through: the bytes go to a temporary file in the
destination's folder, are flushed and fsynced, and only then renamed over the
destination (an atomic step on POSIX file systems), and the folder is fsynced so that
the rename itself survives a power cut. A crash at any moment leaves either the
previous checkpoint or the new one, never a torn file.

Example::

    import json
    from hvdtrain.checkpoint import atomic_write

    with atomic_write("run/state.json") as f:
        f.write(json.dumps({"epoch": 3}).encode())
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Open a binary file that replaces ``path`` only when the block ends without error.

    The parent folder must exist. On an exception the temporary file is removed and
    ``path`` is untouched; after a hard crash a ``.<name>.*.tmp`` file may remain
    beside it, and ``path`` is still the previous, complete version.
    """
    with atomic_path(path, keep_suffixes=False) as temporary, open(temporary, "wb") as file:
        yield file


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, keep_suffixes: bool = True) -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer that takes a path (such as Keras's
    ``model.save``); the file written there replaces ``path`` when the block ends
    without error, after an fsync, as :func:`atomic_write` does.

    Args:
        path: the destination; its folder must exist.
        keep_suffixes: end the temporary name with ``path``'s suffixes
            (``.weights.h5``), for writers that check them.

    Returns:
        The temporary path (an empty file exists there).
    """
    destination = Path(path)
    folder = destination.parent
    if not folder.is_dir():
        raise FileNotFoundError(
            f"cannot write checkpoint {destination}: folder {folder} does not exist; create it "
            "first (for example with os.makedirs(folder, exist_ok=True) on rank 0)"
        )
    suffix = ".tmp" + ("".join(destination.suffixes) if keep_suffixes else "")
    fd, temporary = tempfile.mkstemp(prefix=f".{destination.name}.", suffix=suffix, dir=folder)
    os.close(fd)
    try:
        yield Path(temporary)
        with open(temporary, "rb+") as written:
            os.fsync(written.fileno())
        os.replace(temporary, destination)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _fsync_folder(folder)


def require_checkpoint_file(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path, after checking that it is a non-empty file.

    Raises:
        FileNotFoundError: when there is no file at ``path``.
        ValueError: when the file is empty (never the result of :func:`atomic_write`).
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist (or is not a file)")
    if file.stat().st_size == 0:
        raise ValueError(f"{file} is empty (0 bytes); it was not written by save_checkpoint, "
                         "whose writes are atomic")
    return file


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

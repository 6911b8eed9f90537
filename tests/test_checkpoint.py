"""hvdtrain.checkpoint: atomic_write (a crash at any point leaves a complete file) and the
checks on a file to read."""

import subprocess
import sys
import textwrap

import pytest

from hvdtrain.checkpoint import atomic_path, atomic_write, require_checkpoint_file


def test_writes_and_replaces(tmp_path):
    target = tmp_path / "state.bin"
    with atomic_write(target) as file:
        file.write(b"first")
    with atomic_write(target) as file:
        file.write(b"second")
    assert target.read_bytes() == b"second"
    assert [p.name for p in tmp_path.iterdir()] == ["state.bin"]


def test_an_error_mid_write_keeps_the_previous_file(tmp_path):
    target = tmp_path / "state.bin"
    target.write_bytes(b"previous")
    with pytest.raises(OSError, match="injected"), atomic_write(target) as file:
        file.write(b"half of the new")
        raise OSError("injected")
    assert target.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["state.bin"]


def test_a_hard_crash_mid_write_keeps_the_previous_file(tmp_path):
    target = tmp_path / "state.bin"
    target.write_bytes(b"previous")
    crash = textwrap.dedent(f"""
        import os
        from hvdtrain.checkpoint import atomic_write, require_checkpoint_file
        with atomic_write({str(target)!r}) as file:
            file.write(b"half of the new")
            file.flush()
            os._exit(9)  # the process dies here: no cleanup, no rename
    """)
    assert subprocess.run([sys.executable, "-c", crash]).returncode == 9
    assert target.read_bytes() == b"previous"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "state.bin"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".state.bin.")


def test_a_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"), \
            atomic_write(tmp_path / "nope" / "state.bin"):
        pass


def test_a_checkpoint_to_read_must_exist_and_hold_bytes(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing\.pt does not exist"):
        require_checkpoint_file(tmp_path / "missing.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty.pt is empty \(0 bytes\)"):
        require_checkpoint_file(tmp_path / "empty.pt")
    (tmp_path / "full.pt").write_bytes(b"x")
    assert require_checkpoint_file(str(tmp_path / "full.pt")) == tmp_path / "full.pt"


def test_atomic_path_keeps_the_suffixes_and_replaces_only_on_success(tmp_path):
    target = tmp_path / "model.weights.h5"
    target.write_bytes(b"previous")
    with pytest.raises(OSError, match="injected"), atomic_path(target) as temporary:
        assert temporary.name.startswith(".model.weights.h5.")
        assert temporary.name.endswith(".tmp.weights.h5")  # writers that check suffixes
        temporary.write_bytes(b"half")
        raise OSError("injected")
    assert target.read_bytes() == b"previous"
    with atomic_path(target) as temporary:
        temporary.write_bytes(b"new")
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["model.weights.h5"]

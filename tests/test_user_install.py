"""The install without root (docs/setup.md, "Installing into your own environment"), done as a
user would do it: an ordinary (non-root) account, a fresh venv that already has the
frameworks (as a conda or module environment has), a copy of the checkout, then

    PYTHON=env/bin/python scripts/build-horovod.sh --install
    env/bin/python -m pip install --no-build-isolation -e '.[torch,tensorflow,examples]'

and a 2-worker training run with that environment's horovodrun, which must reach the
final state the set-up's .venv reaches.

The frameworks come from .venv through a folder of links to its packages (all but
Horovod and hvdtrain; pip and setuptools too, since torch needs a newer setuptools than
a fresh venv's), so nothing is downloaded; the Horovod build is served by a
wheel cache holding the set-up's patched wheel under the key the user's environment
computes (the test fails, saying so, if the keys differ: the user's build would then
compile for minutes). pip runs with ``--no-index``: anything missing fails the install.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest
from test_examples import CHECKSUM_LINE, train

from hvdtrain import horovod_patches

REPO = Path(__file__).parents[1]
USER = "hvdtrain-user"
EPOCHS = "2"
# What the user's environment must get from the user's own install, not from .venv.
OURS = ("horovod", "hvdtrain", "__editable__", "_hvdtrain")

INSTALL = """
set -euo pipefail
[ "$(id -u)" -ne 0 ] || { echo "running as root" >&2; exit 1; }
cd "$WORK"
python3.11 -m venv --without-pip env  # pip and setuptools come with the frameworks
site="$(env/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$WORK/frameworks" >"$site/frameworks.pth"
cd hvdtrain
echo "KEY $(PYTHON="$WORK/env/bin/python" bash scripts/build-horovod.sh --cache-key)"
PYTHON="$WORK/env/bin/python" HVDTRAIN_CACHE="$WORK/cache" bash scripts/build-horovod.sh --install
"$WORK/env/bin/python" -m pip install --quiet --no-index --disable-pip-version-check \\
    --no-build-isolation -e '.[torch,tensorflow,examples]'
"$WORK/env/bin/python" -c 'import hvdtrain, horovod
print("FROM", hvdtrain.__file__, horovod.__file__)
from hvdtrain import horovod_patches
print("PATCHES", *sorted(horovod_patches.installed()))'
"$WORK/env/bin/horovodrun" -np 2 --gloo "$WORK/env/bin/python" examples/torch_train.py \\
    --epochs "$EPOCHS" --checkpoint "$WORK/run.pt"
"""


def as_user() -> list[str]:
    """The command prefix that runs as an ordinary user (created when missing)."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", USER], check=True)
    return ["runuser", "-u", USER, "--"]


def _patched_wheel() -> Path:
    key = subprocess.run(["bash", str(REPO / "scripts" / "build-horovod.sh"), "--cache-key"],
                         env={**os.environ, "PYTHON": sys.executable}, capture_output=True,
                         text=True, timeout=120, check=True).stdout.strip()
    cache = Path(os.environ.get("HVDTRAIN_CACHE", Path.home() / ".cache" / "hvdtrain"))
    wheel = next((cache / "wheels" / key).glob("horovod-*.whl"), None)
    if wheel is None:
        pytest.skip(f"the set-up's Horovod wheel is not in {cache / 'wheels' / key}: run "
                    "`make setup`")
    return wheel


def copy_checkout(destination: Path) -> None:
    """The checkout's files (tracked, and untracked ones git does not ignore) into
    ``destination``, as a user's clone has them."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout
    for name in listed.splitlines():
        source = REPO / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)


def _prepare(work: Path, wheel: Path) -> None:
    """The checkout's files, the frameworks folder and the wheel cache, in ``work``."""
    copy_checkout(work / "hvdtrain")
    frameworks = work / "frameworks"
    frameworks.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(OURS) and entry.suffix != ".pth":
            (frameworks / entry.name).symlink_to(entry)
    cached = work / "cache" / "wheels" / wheel.parent.name
    cached.mkdir(parents=True)
    shutil.copy2(wheel, cached / wheel.name)


@pytest.mark.install
@pytest.mark.timeout(900)
def test_a_user_without_root_installs_into_a_fresh_venv_and_trains(tmp_path):
    wheel = _patched_wheel()
    prefix = as_user()
    work = Path(tempfile.mkdtemp(prefix="hvdtrain-user-install-"))
    try:
        _prepare(work, wheel)
        if prefix:
            subprocess.run(["chown", "-R", f"{USER}:{USER}", str(work)], check=True)
        done = subprocess.run(
            [*prefix, "env", f"WORK={work}", f"EPOCHS={EPOCHS}", "bash", "-c", INSTALL],
            capture_output=True, text=True, timeout=780, cwd=work)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-6000:]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = done.stdout.splitlines()
    user_key = next(line.split()[1] for line in lines if line.startswith("KEY "))
    assert user_key == wheel.parent.name, "the user's environment computes another cache key"
    assert "compiling" not in output, "the wheel cache did not serve the build"
    from_line = next(line.split()[1:] for line in lines if line.startswith("FROM "))
    assert all(path.startswith(str(work / "")) for path in from_line), from_line
    patches = next(line.split()[1:] for line in lines if line.startswith("PATCHES"))
    assert patches == [patch.name for patch in horovod_patches.PATCHES]
    _, _, expected = train(tmp_path, "gloo", "--epochs", EPOCHS)
    assert CHECKSUM_LINE.findall(done.stdout) == [expected]

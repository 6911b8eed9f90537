"""The API reference (`make docs`): it builds, and every cross-reference in the docstrings
it is made from (``:func:`...```, ``:class:`...```, ``:mod:`...``` and the like) names
something that exists, so no page links to nothing."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]
ROLE = re.compile(r":(?:func|class|mod|meth|data|attr|exc):`~?([\w.]+)`")
# The command of `make docs` (Makefile), with the output folder last.
DOCS_COMMAND = [sys.executable, "-m", "pdoc", "--docformat", "google", "hvdtrain",
                "!hvdtrain\\._.*", "--output-directory"]


def public_modules() -> list[str]:
    """Every module the reference documents: all of hvdtrain but private ones."""
    root = REPO / "hvdtrain"
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = ("hvdtrain", *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not any(part.startswith("_") for part in parts[1:]):
            names.append(".".join(parts))
    return names


def listed_by_its_packages(module: str) -> bool:
    """Whether every package above ``module`` either has no ``__all__`` or lists it."""
    parts = module.split(".")
    for depth in range(1, len(parts)):
        names = getattr(importlib.import_module(".".join(parts[:depth])), "__all__", None)
        if names is not None and parts[depth] not in names:
            return False
    return True


def resolve(dotted: str) -> bool:
    """Whether ``dotted`` (module, then attributes) names something importable."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for attribute in parts[split:]:
                found = getattr(found, attribute)
        except AttributeError:
            return False
        return True
    return False


def instance_attribute(module: str, owner: str, name: str) -> bool:
    """Whether the class ``owner`` of ``module`` assigns ``self.<name>`` (an attribute
    that exists on instances only)."""
    source = inspect.getsource(getattr(importlib.import_module(module), owner))
    return re.search(rf"self\.{name}\b[^=\n]*=", source) is not None


def candidates(target: str, module: str, owners: list[str]) -> list[str]:
    """Where a reference written in ``module`` (inside the classes ``owners``) may point."""
    package = module if hasattr(importlib.import_module(module), "__path__") \
        else module.rpartition(".")[0]
    if target.startswith("."):
        return [package + target]
    return [target, f"{module}.{target}", *(f"{module}.{owner}.{target}" for owner in owners),
            f"{package}.{target}"]


def references(module_name: str) -> list[tuple[str, str, list[str]]]:
    """Each cross-reference in the module's docstrings: (where, target, enclosing classes)."""
    module = importlib.import_module(module_name)
    found = [(module_name, target, []) for target in ROLE.findall(module.__doc__ or "")]
    for name, value in vars(module).items():
        if getattr(value, "__module__", None) != module_name:
            continue
        owners = [name] if inspect.isclass(value) else []
        members = [(name, value)] + ([(f"{name}.{member}", item)
                                       for member, item in vars(value).items()]
                                      if inspect.isclass(value) else [])
        for where, item in members:
            doc = getattr(item, "__doc__", None) if (
                inspect.isfunction(item) or inspect.isclass(item) or isinstance(item, property)
                or inspect.ismethod(item)) else None
            found.extend((f"{module_name}.{where}", target, owners)
                         for target in ROLE.findall(doc or ""))
    return found


@pytest.fixture(scope="module", autouse=True)
def keras_on_tensorflow():
    if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
        pytest.skip("the reference documents the Keras adapter on its TensorFlow backend")


def test_every_cross_reference_in_the_docstrings_resolves():
    broken = []
    checked = 0
    for module_name in public_modules():
        for where, target, owners in references(module_name):
            checked += 1
            if not (any(resolve(name) for name in candidates(target, module_name, owners))
                    or any(instance_attribute(module_name, owner, target) for owner in owners)):
                broken.append(f"{where}: {target}")
    assert checked > 100
    assert not broken, "cross-references to nothing:\n" + "\n".join(broken)


def test_make_docs_builds_a_page_per_public_module(tmp_path):
    done = subprocess.run([*DOCS_COMMAND, str(tmp_path)], capture_output=True, text=True,
                          timeout=240, cwd=REPO,
                          env={**os.environ, "KERAS_BACKEND": "tensorflow",
                               "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Error" not in done.stderr, done.stderr[-3000:]
    pages = {str(path.relative_to(tmp_path).with_suffix("")).replace(os.sep, ".")
             for path in tmp_path.rglob("*.html")}
    # A package with __all__ (the adapters' facades) documents its public names there,
    # and the submodules it lists; the rest of its modules are its internals.
    expected = {name for name in public_modules() if listed_by_its_packages(name)}
    assert {"hvdtrain.collective", "hvdtrain.adapters.torch", "hvdtrain.adapters.keras",
            "hvdtrain.adapters.keras.callbacks"} <= expected
    assert expected <= pages, expected - pages
    assert shlex.join(DOCS_COMMAND[2:]) in (REPO / "Makefile").read_text()


# The guides: README.md, docs/*.md and benchmarks/README.md link to each other and to
# files of the repository by relative paths, some with a heading's anchor.
GUIDES = [REPO / "README.md", REPO / "benchmarks" / "README.md",
          *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown``: lower case, punctuation
    but hyphens dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", markdown, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("guide", GUIDES, ids=lambda path: str(path.relative_to(REPO)))
def test_every_link_in_the_guides_leads_somewhere(guide):
    broken = []
    for target in LINK.findall(guide.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        file = (guide.parent / path).resolve() if path else guide
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(REPO)}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(f"{target}: no heading with that anchor in {file.name}")
    assert not broken, f"{guide.relative_to(REPO)}: broken links:\n" + "\n".join(broken)

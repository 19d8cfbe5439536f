"""The documentation site (docs/, mkdocs.yml): every public name has an API reference entry.

`mkdocs build --strict` (CI, the `docs` extra) checks that every entry resolves and every link
holds; this test checks, without building, that no public name is left out of the reference.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"

#: Each documented module, and the file whose `__all__` lists its public names (read from the
#: source, so that asyncsearch.ray needs no Ray here, as mkdocstrings needs none).
MODULES = {
    "asyncsearch": "asyncsearch/__init__.py",
    "asyncsearch.models": "asyncsearch/_models.py",  # models.py re-exports _models.__all__
    "asyncsearch.concurrency": "asyncsearch/concurrency.py",
    "asyncsearch.testing": "asyncsearch/testing/__init__.py",
    "asyncsearch.arrow": "asyncsearch/arrow.py",
    "asyncsearch.ray": "asyncsearch/ray.py",
}


def public_names(path: str) -> list[str]:
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            names = ast.literal_eval(node.value)
            assert isinstance(names, list)
            return names
    raise AssertionError(f"{path} has no literal __all__")


def reference_entries() -> set[str]:
    """Every object a `::: path` line of the reference pages renders."""
    entries: set[str] = set()
    for page in REFERENCE.glob("*.md"):
        entries |= set(re.findall(r"^::: ([\w.]+)\s*$", page.read_text(encoding="utf-8"), re.M))
    return entries


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_public_name_has_an_api_reference_entry(module: str) -> None:
    entries = reference_entries()
    missing = [name for name in public_names(MODULES[module]) if f"{module}.{name}" not in entries]
    assert missing == [], f"add `::: {module}.NAME` to docs/reference/{module}.md for {missing}"


def test_the_reference_documents_nothing_that_is_not_public() -> None:
    """An entry for a name that left `__all__` (or a typo) is caught here, before mkdocs."""
    public = {f"{module}.{name}" for module, path in MODULES.items() for name in public_names(path)}
    extra = {"asyncsearch.testing.pytest_plugin"}  # a module: its fixtures and marker
    assert reference_entries() - public - extra == set()


def test_public_modules_match_the_package() -> None:
    """The names read from the source are the ones Python sees (ray aside: not imported here)."""
    import asyncsearch
    import asyncsearch.arrow
    import asyncsearch.concurrency
    import asyncsearch.models
    import asyncsearch.testing

    modules = {
        "asyncsearch": asyncsearch,
        "asyncsearch.models": asyncsearch.models,
        "asyncsearch.concurrency": asyncsearch.concurrency,
        "asyncsearch.testing": asyncsearch.testing,
        "asyncsearch.arrow": asyncsearch.arrow,
    }
    for name, module in modules.items():
        assert public_names(MODULES[name]) == list(module.__all__), name

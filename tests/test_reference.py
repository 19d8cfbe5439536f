"""The API reference as the site renders it: griffe's reading of the package, through the
extension the site loads (docs/griffe_public_api.py), with the docstring style mkdocs.yml sets.

- every parameter of a public callable is documented in its docstring's ``Args:`` section, and
  nothing documented there is missing from the signature;
- no rendered signature, base or attribute value names anything a caller cannot import from a
  public module (``_Prepared``, ``AsyncClosing``, ``_Wire``...);
- no attribute shows implementation code as its value;
- every docstring parses without a warning from griffe (a section that is not one, a bad
  indentation...).

Public callables: the functions and classes of every documented module's ``__all__``, their
methods and properties (inherited ones included, as the site shows them), a class's
``__init__`` merged into the class (``merge_init_into_class``). The objects that are new or are
being rewritten in other branches get no exception here: a module that appears is checked too.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

griffe = pytest.importorskip("griffe", reason="the reference tests read the package with griffe")

ROOT = Path(__file__).resolve().parent.parent
MKDOCS = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def _extension() -> object:
    spec = importlib.util.spec_from_file_location(
        "griffe_public_api", ROOT / "docs" / "griffe_public_api.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("griffe_public_api", module)
    spec.loader.exec_module(module)
    return module


ext = _extension()


@pytest.fixture(scope="module")
def package(caplog_module: list[logging.LogRecord]) -> griffe.Module:
    return _load()


#: The package loaded (for resolving a name's path).
_PACKAGE: list[griffe.Module] = []


def _load() -> griffe.Module:
    loaded = griffe.load(
        "asyncsearch",
        search_paths=[str(ROOT)],
        extensions=griffe.load_extensions(ext.PublicAPI),  # type: ignore[attr-defined]
        docstring_parser=griffe.Parser.google,
        allow_inspection=False,
        resolve_aliases=True,
        resolve_implicit=True,
    )
    assert isinstance(loaded, griffe.Module)
    _PACKAGE[:] = [loaded]
    return loaded


@pytest.fixture(scope="module")
def caplog_module() -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.WARNING)
    logger = logging.getLogger("griffe")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def public_objects(package: griffe.Module) -> dict[str, griffe.Object]:
    """Every rendered public object, by the path the reference shows it under."""
    found: dict[str, griffe.Object] = {}
    for module_name in ext.PUBLIC_MODULES:  # type: ignore[attr-defined]
        module = package.modules_collection.get_member(module_name)
        for name in ext._exports(module):  # type: ignore[attr-defined]
            member = module.members[str(name)]
            target = member.final_target if member.is_alias else member
            _collect(f"{module_name}.{name}", target, found)
    return found


def _collect(path: str, obj: griffe.Object, found: dict[str, griffe.Object]) -> None:
    found[path] = obj
    if not obj.is_class:
        return
    members = {**obj.inherited_members, **obj.members}
    for name, member in members.items():
        if name.startswith("_"):
            continue
        try:
            target = member.final_target if member.is_alias else member
        except griffe.AliasResolutionError:
            continue
        if target.is_function or target.is_attribute:
            found[f"{path}.{name}"] = target


def _callable_parameters(obj: griffe.Object) -> list[griffe.Parameter] | None:
    """The parameters the reference shows for ``obj`` (a class's are its ``__init__``'s)."""
    if obj.is_function:
        function = obj
    elif obj.is_class:
        init = obj.all_members.get("__init__")
        if init is None:
            return None
        function = init.final_target if init.is_alias else init
        if function.parent is not None and not function.parent.path.startswith("asyncsearch"):
            return None  # object.__init__, a Struct's generated one: nothing to document
    else:
        return None
    return [p for p in function.parameters if p.name not in {"self", "cls"}]


def _documented(obj: griffe.Object) -> set[str]:
    """The parameters the docstring documents; a class's and its ``__init__``'s, merged as the
    site merges them (``merge_init_into_class``)."""
    docstrings = [obj.docstring]
    if obj.is_class:
        init = obj.all_members.get("__init__")
        docstrings.append(init.docstring if init is not None else None)
    names: set[str] = set()
    for docstring in docstrings:
        for section in docstring.parsed if docstring is not None else ():
            if section.kind in {
                griffe.DocstringSectionKind.parameters,
                griffe.DocstringSectionKind.other_parameters,
            }:
                names |= {p.name.lstrip("*") for p in section.value}
    return names


def test_the_site_parses_google_docstrings_through_the_extension() -> None:
    assert re.search(r"^\s+docstring_style: google$", MKDOCS, re.M)
    assert re.search(r"^\s+merge_init_into_class: true$", MKDOCS, re.M)
    assert "docs/griffe_public_api.py" in MKDOCS


def test_every_parameter_of_a_public_callable_is_documented(package: griffe.Module) -> None:
    problems = []
    for path, obj in sorted(public_objects(package).items()):
        parameters = _callable_parameters(obj)
        if not parameters:
            continue
        documented = _documented(obj)
        names = {p.name for p in parameters}
        if obj.is_class:
            # A field of a dataclass or Struct: its own docstring renders beside it.
            documented |= {
                name
                for name in names
                if name in obj.all_members and obj.all_members[name].docstring is not None
            }
        missing = sorted(names - documented)
        extra = sorted(documented - names - set(obj.all_members if obj.is_class else ()))
        if missing:
            problems.append(f"{path}: not in its Args: {', '.join(missing)}")
        if extra:
            problems.append(f"{path}: in its Args but not a parameter: {', '.join(extra)}")
    assert problems == [], "\n".join(problems)


def _names(expr: object) -> Iterator[griffe.ExprName]:
    if isinstance(expr, griffe.ExprName):
        yield expr
    if isinstance(expr, griffe.Expr):
        for part in expr.iterate(flat=False):
            if part is not expr:
                yield from _names(part)


def _private(name: griffe.ExprName, public: set[str]) -> bool:
    """A name the reader cannot import: an object of this package that no ``__all__`` names."""
    path = name.canonical_path
    if not path.startswith("asyncsearch"):
        return False
    if path in public:
        return False
    try:
        target = _PACKAGE[0].modules_collection.get_member(path)
    except (KeyError, ValueError, IndexError):
        target = None
    if target is not None and (target.is_module or getattr(target, "is_type_parameter", False)):
        return False
    # A type variable of the package (``JobId``, ``T``) is shown as such, not imported.
    return not (target is not None and target.is_attribute and _is_type_variable(target))


def _is_type_variable(attribute: griffe.Object) -> bool:
    value = str(getattr(attribute, "value", "") or "")
    return value.startswith(("TypeVar(", "TypeVarWithDefault(", "ParamSpec("))


def _rendered_expressions(obj: griffe.Object) -> Iterator[tuple[str, object]]:
    """Every expression the reference renders for ``obj``: signature, bases, attribute value."""
    if obj.is_class:
        for base in obj.bases:
            yield "base", base
        init = obj.all_members.get("__init__")
        if init is not None:
            obj = init.final_target if init.is_alias else init
    if obj.is_function:
        for parameter in obj.parameters:
            yield f"parameter {parameter.name}", parameter.annotation
            yield f"default of {parameter.name}", parameter.default
        yield "return", obj.returns
    if obj.is_attribute:
        yield "annotation", obj.annotation
        yield "value", obj.value


def test_no_private_name_in_a_rendered_signature_or_base(package: griffe.Module) -> None:
    public = ext.public_paths(package)  # type: ignore[attr-defined]
    problems = []
    for path, obj in sorted(public_objects(package).items()):
        for where, expr in _rendered_expressions(obj):
            private = sorted({n.canonical_path for n in _names(expr) if _private(n, public)})
            if private:
                problems.append(f"{path}: {where} names {', '.join(private)}")
    assert problems == [], "\n".join(problems)


def test_no_attribute_shows_code_as_its_value(package: griffe.Module) -> None:
    """A value is shown only when it is data: a constant, a name, a container of those."""
    problems = []
    for path, obj in sorted(public_objects(package).items()):
        if obj.is_attribute and obj.value is not None and not _is_data(obj.value):
            problems.append(f"{path} = {obj.value}")
    assert problems == [], "\n".join(problems)


def _is_data(expr: object) -> bool:
    if isinstance(expr, str):  # a constant (griffe keeps some as their source text)
        return True
    if isinstance(expr, griffe.ExprConstant | griffe.ExprName | griffe.ExprAttribute):
        return True
    if isinstance(expr, griffe.ExprTuple | griffe.ExprList | griffe.ExprSet):
        return all(_is_data(e) for e in expr.elements)
    if isinstance(expr, griffe.ExprDict):
        return all(_is_data(e) for e in [*expr.keys, *expr.values])
    if isinstance(expr, griffe.ExprUnaryOp | griffe.ExprBinOp):
        return all(_is_data(e) for e in expr.iterate(flat=False) if isinstance(e, griffe.Expr))
    if isinstance(expr, griffe.ExprSubscript):  # Literal["json", "markdown"]
        return _is_data(expr.left) and _is_data(expr.slice)
    if isinstance(expr, griffe.ExprKeyword):
        return _is_data(expr.value)
    if isinstance(expr, griffe.ExprCall):
        # frozenset({...}), pa.schema([...]): a value built from data. A call of the package's
        # own code (check_positive(...)) names a private function: the test above fails it.
        return str(expr.function) not in _CODE and all(_is_data(a) for a in expr.arguments)
    return False


#: Callables whose result is behaviour, not data.
_CODE = {"property", "classmethod", "staticmethod", "functools.cached_property"}


def test_griffe_reads_every_docstring_without_a_warning(
    package: griffe.Module, caplog_module: list[logging.LogRecord]
) -> None:
    for obj in public_objects(package).values():
        if obj.docstring is not None:
            obj.docstring.parsed  # noqa: B018 (parsing is what logs the warnings)
    warnings = [r.getMessage() for r in caplog_module if "asyncsearch" in r.getMessage()]
    assert warnings == [], "\n".join(warnings)

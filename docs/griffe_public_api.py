"""A griffe extension: the API reference shows the public API as a caller meets it.

griffe reads the source statically (``allow_inspection: false`` in mkdocs.yml), so it sees what
the source spells, not what Python builds at import time. Four things differ, and are fixed here
for the site (mkdocs.yml loads this file) and for ``tests/test_reference.py``, which checks the
reference through it:

- An endpoint method (``@_Endpoint def search(...) -> _Prepared[SearchPage]``) is, on a client,
  a coroutine function returning the model: it is shown as ``async def search(...) ->
  SearchPage``. ``RawResponseClient``'s endpoints (``search = AsyncSearchClient.search`` in its
  body) are shown as methods with the same parameters returning ``APIResponse[SearchPage]``.
- A base class that is not public (``AsyncClosing``, ``_AttemptOptions``, ``_Wire``) is replaced
  by its own bases, its members kept as the class's own: the reader sees what the class has,
  and no name they cannot import.
- The "not given" sentinel: ``NotGiven`` is dropped from annotations and a ``NOT_GIVEN``
  default is shown as ``...`` (a default the docstring describes).
- A private type alias (``Number``, ``ClientMiddleware``, ``List[T]``) is shown as what it
  stands for, a private constant used as a default (``DEFAULT_RETRY``) as its value, and
  ``**params: Unpack[D]`` of a private ``TypedDict`` as the keyword parameters it holds (with
  ``**params: Unpack[P]`` for what a public ``TypedDict`` ``P`` among its bases holds).
- A value that still calls or names code of the package that is not public
  (``field(default_factory=_request_log)``) is shown as ``...``.
- A class whose ``__init__`` takes an object of the package that is not public is made by the
  package, never by a caller: no constructor is shown.
- An attribute set in ``__init__`` (only there) shows no value: its value is code
  (``check_positive(...)``), not a constant.
- The keys of a private ``TypedDict`` a function takes (``**params``) that its ``Args:`` does not
  describe are described by the key's own docstring, written once where the key is declared.
- A function decorated ``@_parameters_of(other)`` (``SearchClient.__init__``, which takes
  ``AsyncSearchClient``'s arguments) is shown with ``other``'s parameters, and its class's
  docstring gets the ``Args:`` section of ``other``'s class.
"""

from __future__ import annotations

import copy
from typing import Any

import griffe

#: The documented modules: their ``__all__`` is the public API.
PUBLIC_MODULES = (
    "asyncsearch",
    "asyncsearch.models",
    "asyncsearch.concurrency",
    "asyncsearch.testing",
    "asyncsearch.arrow",
    "asyncsearch.ray",
)
_ENDPOINT = "_Endpoint"
_PREPARED = "_Prepared"
_NOT_GIVEN_TYPE = "NotGiven"
_NOT_GIVEN = "NOT_GIVEN"
_PARAMETERS_OF = "_parameters_of"


def public_paths(package: griffe.Module) -> set[str]:
    """The paths of every object a public module's ``__all__`` names (as exported, and where
    it is defined)."""
    paths: set[str] = set()
    for name in PUBLIC_MODULES:
        module = package if name == package.name else package.get_member(name.split(".", 1)[1])
        for exported in _exports(module):
            member = module.members.get(exported)
            if member is None:
                continue
            paths.add(f"{name}.{exported}")
            try:
                paths.add(member.final_target.path if member.is_alias else member.path)
            except griffe.AliasResolutionError:
                continue
    return paths


def _exports(module: griffe.Module) -> list[str]:
    """``module.__all__``, also when it is imported (``from ._models import __all__``)."""
    if module.exports is not None:
        return [str(name) for name in module.exports]
    imported = module.members.get("__all__")
    if imported is not None and imported.is_alias:
        return _exports(imported.final_target.parent)  # type: ignore[arg-type]
    return []


class PublicAPI(griffe.Extension):
    """See the module's docstring."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != "asyncsearch":
            return
        public = public_paths(pkg)
        for obj in _walk(pkg):
            if obj.is_function:
                _parameters_from(obj)  # type: ignore[arg-type]
                _show_endpoint(obj)  # type: ignore[arg-type]
                _hide_not_given(obj)  # type: ignore[arg-type]
                _expand_private_kwargs(obj, public)  # type: ignore[arg-type]
                for parameter in obj.parameters:  # type: ignore[attr-defined]
                    parameter.annotation = _expand(parameter.annotation, public)
                    parameter.default = _shown_value(_expand(parameter.default, public), public)
                obj.returns = _expand(obj.returns, public)  # type: ignore[attr-defined]
            elif obj.is_attribute:
                obj.annotation = _expand(obj.annotation, public)  # type: ignore[attr-defined]
                obj.value = _shown_value(_expand(obj.value, public), public)  # type: ignore[attr-defined]
                if obj.labels >= {"instance-attribute"} and "class-attribute" not in obj.labels:
                    obj.value = None  # type: ignore[attr-defined]  # set in __init__: code
            elif obj.is_class:
                _show_raw_endpoints(obj)  # type: ignore[arg-type]
        for obj in _walk(pkg):
            if obj.is_class:
                _hide_internal_constructor(obj, public)  # type: ignore[arg-type]
        # Bases last: the endpoints above are copied into subclasses as they are now.
        for obj in _walk(pkg):
            if obj.is_class:
                _drop_private_bases(obj, public)  # type: ignore[arg-type]


def _walk(obj: griffe.Object) -> list[griffe.Object]:
    """Every object defined in ``obj`` (aliases left out), ``obj`` first."""
    found = [obj]
    for member in list(obj.members.values()):
        if not member.is_alias:
            found.extend(_walk(member))  # type: ignore[arg-type]
    return found


def _show_endpoint(function: griffe.Function) -> None:
    """``@_Endpoint def f(...) -> _Prepared[M]``: shown as ``async def f(...) -> M``."""
    decorators = [d for d in function.decorators if str(d.value) == _ENDPOINT]
    returns = function.returns
    if not decorators or not isinstance(returns, griffe.ExprSubscript):
        return
    if str(returns.left) != _PREPARED:
        return
    function.decorators = [d for d in function.decorators if d not in decorators]
    function.returns = returns.slice
    function.labels.add("async")


def _show_raw_endpoints(cls: griffe.Class) -> None:
    """``search = AsyncSearchClient.search`` in a class body: a method returning the raw answer."""
    for name, member in list(cls.members.items()):
        if member.is_alias or not member.is_attribute:
            continue
        value = member.value  # type: ignore[union-attr]
        if not isinstance(value, griffe.ExprAttribute):
            continue
        try:
            owner = cls.module.members[str(value.first)]
            if owner.is_alias or not owner.is_class:
                continue
            target = owner.members[value.last.name]
        except (KeyError, AttributeError, griffe.AliasResolutionError):
            continue
        if not target.is_function or "async" not in target.labels:
            continue
        returns = griffe.ExprSubscript(
            griffe.ExprName("APIResponse", parent=cls.module), target.returns
        )
        method = griffe.Function(
            name,
            lineno=member.lineno,
            endlineno=member.endlineno,
            parameters=griffe.Parameters(*(copy.copy(p) for p in target.parameters)),
            returns=returns,
            docstring=_raw_docstring(target, cls.module),
        )
        method.labels.add("async")
        cls.set_member(name, method)


def _raw_docstring(endpoint: griffe.Function, module: griffe.Module) -> griffe.Docstring | None:
    """The endpoint's docstring, saying that this variant returns the ``APIResponse``."""
    if endpoint.docstring is None:
        return None
    owner = endpoint.parent
    lines = endpoint.docstring.value.splitlines()
    summary = (
        f"[`{owner.name}.{endpoint.name}`][{owner.path}.{endpoint.name}], returning the "
        "[`APIResponse`][asyncsearch.APIResponse] (status, headers, attempts): its "
        "`parse()` gives what that method returns."
    )
    text = "\n".join([summary, *_without_section(lines[1:], "Returns:")])
    return griffe.Docstring(text, parent=module, parser=endpoint.docstring.parser)


def _without_section(lines: list[str], title: str) -> list[str]:
    """``lines`` of a Google style docstring without the section ``title`` (e.g. ``Returns:``)."""
    kept: list[str] = []
    skipping = False
    for line in lines:
        if line.strip() == title:
            skipping = True
            continue
        if skipping and line.strip() and not line.startswith((" " * 4, "\t")):
            skipping = False
        if not skipping:
            kept.append(line)
    return kept


def _parameters_from(function: griffe.Function) -> None:
    """``@_parameters_of(other) def f(*args, **kwargs)``: ``other``'s parameters, and the Args
    section of ``other``'s class in ``f``'s class's docstring (where ``__init__``'s are read)."""
    for decorator in function.decorators:
        call = decorator.value
        if not (isinstance(call, griffe.ExprCall) and str(call.function) == _PARAMETERS_OF):
            continue
        donor = function.modules_collection.get_member(call.arguments[0].canonical_path)  # type: ignore[union-attr]
        function.parameters = copy.deepcopy(donor.parameters)
        owner, source = function.parent, donor.parent
        if owner is None or owner.docstring is None or source is None or source.docstring is None:
            return
        lines = source.docstring.value.splitlines()
        start = next((i for i, line in enumerate(lines) if line.strip() == "Args:"), None)
        if start is not None:
            end = next(
                (
                    i
                    for i in range(start + 1, len(lines))
                    if lines[i].strip() and not lines[i].startswith(" ")
                ),
                len(lines),
            )
            text = "\n".join([owner.docstring.value, "", *lines[start:end]])
            owner.docstring = griffe.Docstring(text, parent=owner, parser=owner.docstring.parser)


def _hide_not_given(function: griffe.Function) -> None:
    """``x: T | NotGiven = NOT_GIVEN`` is shown as ``x: T = ...``."""
    for parameter in function.parameters:
        parameter.annotation = _without_not_given(parameter.annotation)
        if parameter.default is not None and str(parameter.default) == _NOT_GIVEN:
            parameter.default = "..."


def _without_not_given(annotation: str | griffe.Expr | None) -> str | griffe.Expr | None:
    if isinstance(annotation, griffe.ExprBinOp) and annotation.operator == "|":
        left = _without_not_given(annotation.left)
        right = _without_not_given(annotation.right)
        if str(right) == _NOT_GIVEN_TYPE:
            return left
        if str(left) == _NOT_GIVEN_TYPE:
            return right
        return griffe.ExprBinOp(left, "|", right)  # type: ignore[arg-type]
    return annotation


def _drop_private_bases(cls: griffe.Class, public: set[str]) -> None:
    """Replace each base that is not public by its own bases, keeping what it gave the class."""
    if not any(_is_private_base(base, cls, public) for base in cls.bases):
        return
    # What the class inherits now, before the bases change (the public bases still give theirs).
    inherited = dict(cls.inherited_members.items())
    bases: list[str | griffe.Expr] = []
    for base in cls.bases:
        bases.extend(_public_bases(base, cls, public))
    cls.bases = bases
    still = cls.inherited_members
    for name, member in inherited.items():
        if name not in still and name not in cls.members:
            cls.set_member(name, member)


def _resolve(base: str | griffe.Expr, cls: griffe.Class) -> griffe.Object | None:
    if not isinstance(base, griffe.Expr):
        return None
    try:
        target = cls.modules_collection.get_member(base.canonical_path)
    except (KeyError, ValueError, AttributeError):
        return None
    try:
        return target.final_target if target.is_alias else target
    except griffe.AliasResolutionError:
        return None


def _is_private_base(base: str | griffe.Expr, cls: griffe.Class, public: set[str]) -> bool:
    target = _resolve(base, cls)
    return target is not None and target.is_class and target.path not in public


def _public_bases(
    base: str | griffe.Expr, cls: griffe.Class, public: set[str]
) -> list[str | griffe.Expr]:
    if not _is_private_base(base, cls, public):
        return [base]
    target = _resolve(base, cls)
    assert isinstance(target, griffe.Class)
    found: list[str | griffe.Expr] = []
    for parent in target.bases:
        found.extend(_public_bases(parent, target, public))
    return found


def _private_target(expr: object, public: set[str]) -> griffe.Object | None:
    """The object of this package that ``expr`` (a name) stands for, if no ``__all__`` has it."""
    if not isinstance(expr, griffe.ExprName | griffe.ExprAttribute):
        return None
    path = expr.canonical_path
    if not path.startswith("asyncsearch.") or path in public:
        return None
    try:
        target = _owner(expr).modules_collection.get_member(path)
        return target.final_target if target.is_alias else target  # type: ignore[no-any-return]
    except (KeyError, ValueError, AttributeError, griffe.AliasResolutionError):
        return None


def _owner(expr: griffe.ExprName | griffe.ExprAttribute) -> griffe.Object:
    """The object whose source holds the name ``expr``."""
    parent: Any = expr.last if isinstance(expr, griffe.ExprAttribute) else expr
    while isinstance(parent, griffe.ExprName):
        parent = parent.parent
    return parent  # type: ignore[no-any-return]


def _type_variables(value: griffe.Expr) -> list[str]:
    """The names in ``value`` that are type variables of its module (``_T`` of ``list[_T]``)."""
    found = []
    for part in value.iterate(flat=True):
        if isinstance(part, griffe.ExprName):
            try:
                target = part.parent.modules_collection.get_member(part.canonical_path)  # type: ignore[union-attr]
            except (KeyError, ValueError, AttributeError):
                continue
            if target.is_attribute and str(target.value or "").startswith("TypeVar("):
                found.append(part.name)
    return found


def _substitute(expr: Any, names: dict[str, Any]) -> Any:
    """A copy of ``expr`` with each name of ``names`` replaced."""
    if isinstance(expr, griffe.ExprName) and expr.name in names:
        return names[expr.name]
    if not isinstance(expr, griffe.Expr):
        return expr
    new = copy.copy(expr)
    for field_name in getattr(new, "__dataclass_fields__", {}):
        value = getattr(new, field_name)
        if isinstance(value, list):
            setattr(new, field_name, [_substitute(item, names) for item in value])
        elif isinstance(value, griffe.Expr):
            setattr(new, field_name, _substitute(value, names))
    return new


def _expand(expr: Any, public: set[str], seen: frozenset[str] = frozenset()) -> Any:
    """``expr`` with private type aliases and constants replaced by what they stand for."""
    if isinstance(expr, griffe.ExprSubscript):
        target = _private_target(expr.left, public)
        value = (
            getattr(target, "value", None) if target is not None and target.is_attribute else None
        )
        if isinstance(value, griffe.ExprSubscript):  # List[X] of List = list[_T]
            variables = _type_variables(value)
            arguments = (
                expr.slice.elements if isinstance(expr.slice, griffe.ExprTuple) else [expr.slice]
            )
            if len(variables) == len(arguments):
                expanded = _substitute(value, dict(zip(variables, arguments, strict=True)))
                return _expand(expanded, public, seen | {target.path})  # type: ignore[union-attr]
    target = _private_target(expr, public)
    if (
        target is not None
        and target.path not in seen
        and target.is_attribute
        and isinstance(target.value, griffe.Expr | str)  # type: ignore[attr-defined]
    ):
        value = target.value  # type: ignore[attr-defined]
        if not str(value).startswith(("TypeVar(", "ParamSpec(")):
            return _expand(value, public, seen | {target.path})
    if isinstance(expr, griffe.Expr):
        return _substitute_all(expr, public, seen)
    return expr


def _substitute_all(expr: griffe.Expr, public: set[str], seen: frozenset[str]) -> griffe.Expr:
    new = copy.copy(expr)
    for field_name in getattr(new, "__dataclass_fields__", {}):
        value = getattr(new, field_name)
        if isinstance(value, list):
            setattr(new, field_name, [_expand(item, public, seen) for item in value])
        elif isinstance(value, griffe.Expr) and field_name != "parent":
            setattr(new, field_name, _expand(value, public, seen))
    return new


def _expand_private_kwargs(function: griffe.Function, public: set[str]) -> None:
    """``**params: Unpack[D]``, ``D`` a private ``TypedDict``: its keys as keyword parameters."""
    parameters = list(function.parameters)
    if not parameters or parameters[-1].kind is not griffe.ParameterKind.var_keyword:
        return
    variadic = parameters[-1]
    annotation = variadic.annotation
    if not isinstance(annotation, griffe.ExprSubscript) or str(annotation.left) != "Unpack":
        return
    typed_dict = _private_target(annotation.slice, public)
    if typed_dict is None or not typed_dict.is_class:
        return
    keys: dict[str, griffe.Attribute] = {}
    kept: list[griffe.Expr] = []
    _typed_dict_keys(typed_dict, public, keys, kept)  # type: ignore[arg-type]
    taken = {p.name for p in parameters}
    added = [
        griffe.Parameter(
            name,
            annotation=attribute.annotation,
            kind=griffe.ParameterKind.keyword_only,
            default="...",
            docstring=attribute.docstring,
        )
        for name, attribute in keys.items()
        if name not in taken
    ]
    rest = [
        griffe.Parameter(
            variadic.name,
            annotation=griffe.ExprSubscript(annotation.left, base),
            kind=griffe.ParameterKind.var_keyword,
        )
        for base in kept[:1]
    ]
    function.parameters = griffe.Parameters(*parameters[:-1], *added, *rest)
    _document(function, {p.name: p.docstring for p in added if p.docstring is not None})


def _document(function: griffe.Function, keys: dict[str, griffe.Docstring]) -> None:
    """Give ``function``'s ``Args:`` an entry for each key of a ``TypedDict`` it takes and does
    not describe itself: the key's own docstring, written once where the key is declared."""
    if function.docstring is None or not keys:
        return
    lines = function.docstring.value.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "Args:"), None)
    if start is None:
        return
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith((" ", "\t"))):
        end += 1
    while lines[end - 1].strip() == "":
        end -= 1
    indent = lines[start + 1][: len(lines[start + 1]) - len(lines[start + 1].lstrip())]
    told = {line.strip().split(":", 1)[0].lstrip("*") for line in lines[start + 1 : end]}
    # Before **params, which is listed last.
    at = next((i for i in range(start + 1, end) if lines[i].strip().startswith("**")), end)
    entries = [
        f"{indent}{name}: {' '.join(doc.value.split())}"
        for name, doc in keys.items()
        if name not in told
    ]
    text = "\n".join([*lines[:at], *entries, *lines[at:]])
    function.docstring = griffe.Docstring(text, parent=function, parser=function.docstring.parser)


def _typed_dict_keys(
    cls: griffe.Class, public: set[str], keys: dict[str, griffe.Attribute], kept: list[griffe.Expr]
) -> None:
    """The keys of the private ``TypedDict`` ``cls`` (bases first); its public bases in ``kept``."""
    for base in cls.bases:
        if not isinstance(base, griffe.Expr) or str(base) == "TypedDict":
            continue
        target = _private_target(base, public)
        if target is None:
            kept.append(base)
        elif target.is_class:
            _typed_dict_keys(target, public, keys, kept)  # type: ignore[arg-type]
    for name, member in cls.members.items():
        if member.is_attribute and not member.is_alias:
            keys[name] = member  # type: ignore[assignment]


def _hide_internal_constructor(cls: griffe.Class, public: set[str]) -> None:
    """No constructor for a class whose ``__init__`` takes a private object of the package."""
    init = cls.members.get("__init__")
    if init is None or init.is_alias:
        return
    for parameter in init.parameters:  # type: ignore[attr-defined]
        for part in _flat(parameter.annotation):
            if _private_target(part, public) is not None:
                cls.del_member("__init__")
                return


def _flat(expr: object) -> list[object]:
    """``expr`` and every expression inside it."""
    if not isinstance(expr, griffe.Expr):
        return []
    found: list[object] = [expr]
    for part in expr.iterate(flat=False):
        if part is not expr:
            found.extend(_flat(part))
    return found


def _shown_value(expr: Any, public: set[str]) -> Any:
    """``expr``, or ``...`` when it names a function or class of the package that is private."""
    for part in _flat(expr):
        target = _private_target(part, public)
        if target is not None and (target.is_function or target.is_class):
            return "..."
    return expr

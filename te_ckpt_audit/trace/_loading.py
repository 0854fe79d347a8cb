"""Load a target (``path/to/file.py:attr`` or ``package.module:attr``) and its example inputs,
placed on the mesh where one is given.

The user's file is imported as Python would import it, so its code runs: module-level statements
included. A file inside a package (folders with ``__init__.py``) is imported under its dotted
name, with the package's parent folder on ``sys.path``, so its relative imports work.
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import dataclasses
import difflib
import importlib
import importlib.machinery
import importlib.util
import inspect
import math
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec, Sharding
from jax.tree_util import KeyEntry

from ..errors import AuditError, TargetError, UsageError, a_or_an, first_line
from ._source import raised_in_user_code, user_location

Placement = jax.sharding.Mesh | jax.sharding.AbstractMesh | None  # where the inputs are placed
Defines = Mapping[str, str]  # `-D key=value`: keyword parameters of the inputs callable, raw text
_FEATURE = type(__future__.annotations)  # `from __future__ import annotations` binds one
INPUTS_SUFFIX = "_inputs"
FALLBACK_INPUTS = "example_inputs"


def split_target(text: str, what: str = "target") -> tuple[str, str]:
    """`FILE.py:NAME` or `package.module:NAME` as (where, name).

    >>> split_target("sample_models/gpt.py:loss")
    ('sample_models/gpt.py', 'loss')
    """
    where, sep, attr = text.strip().rpartition(":")
    if not text.strip():
        raise UsageError(f"empty {what}", "give FILE.py:NAME or package.module:NAME")
    if "::" in text:  # pytest's node syntax, typed from habit
        raise UsageError(f"{what} {text!r} has '::'; a target takes one ':'",
                         f"e.g. {text.replace('::', ':', 1)}")
    if not sep or not where or not attr:
        raise UsageError(
            f"{what} {text!r} is not of the form FILE.py:NAME or package.module:NAME",
            "e.g. sample_models/gpt.py:loss",
        )
    return where, attr


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    fn: Callable[..., Any]
    module: ModuleType
    attr: str
    text: str  # as the user typed it


@dataclasses.dataclass(frozen=True, slots=True)
class Inputs:
    args: tuple[object, ...]
    source: str  # "file.py:callable" that made them
    overrides: tuple[tuple[str, object], ...]
    keywords: Mapping[str, object] = dataclasses.field(default_factory=dict)  # every keyword it was called with


@contextlib.contextmanager
def user_code(what: str) -> Iterator[None]:
    """Run the user's code (import, inputs callable, traced function, policies) under one rule:
    `sys.exit` there, or an exception raised in their own frames that no stage turned into an
    AuditError, is a TargetError; it never ends the tool or passes for an internal error."""
    try:
        yield
    except AuditError:
        raise
    except SystemExit as exc:
        raise TargetError(
            f"{what}: the user's code called sys.exit({exc.code!r}) at {user_location(exc)}",
            "code that is imported or traced must not exit; guard it with `if __name__ == '__main__':`",
        ) from exc
    except Exception as exc:
        if not raised_in_user_code(exc):
            raise
        shown: BaseException = exc
        if traceback.extract_tb(exc.__traceback__)[-1].name in ("__str__", "__repr__") and exc.__context__:
            shown = exc.__context__  # the user's exception, whose message could not be made
        raise TargetError(
            f"{what}: the user's code raised {type(shown).__name__} at {user_location(shown)}: {first_line(shown)}",
            "fix the model code ($debug$)",
        ) from exc


def _import_file(path: Path) -> ModuleType:
    path = path.resolve()
    folder = path.parent
    parts = [path.stem]
    while (folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        folder = folder.parent
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    name = ".".join(parts)
    existing = sys.modules.get(name)
    # vars(), not getattr: a module's own __getattr__ (PEP 562) is code of the user's process
    if existing is not None and Path(_file_of(existing)).resolve() == path:
        return existing
    if len(parts) > 1:
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _file_of(module: ModuleType) -> str:
    try:
        found = vars(module).get("__file__")
    except TypeError:
        return ""
    return found if isinstance(found, str) else ""


def import_module(where: str) -> ModuleType:
    """Import `where` (a .py path or a dotted module name); user-code failures are TargetErrors."""
    is_file = where.endswith(".py") or os.sep in where or "/" in where or Path(where).is_file()
    if is_file:
        path = Path(where)
        if not path.is_file():
            raise UsageError(f"no such file: {where}", "check the path; it is relative to the current folder")
        if path.suffix != ".py":
            raise UsageError(f"{where} is not a .py file", "a target is FILE.py:NAME or package.module:NAME")
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        if importlib.util.find_spec(where.split(".")[0]) is None:
            raise UsageError(f"no module named {where!r}", "give a FILE.py path, or install the package")
    try:
        return _import_file(Path(where)) if is_file else importlib.import_module(where)
    except SyntaxError as exc:
        raise TargetError(
            f"syntax error in {exc.filename}:{exc.lineno}: {exc.msg}", "fix the model file"
        ) from exc
    except ModuleNotFoundError as exc:
        raise TargetError(
            f"importing {where} failed at {user_location(exc)}: {first_line(exc)}",
            "install the missing package or fix the import",
        ) from exc
    except Exception as exc:
        raise TargetError(
            f"importing {where} raised {type(exc).__name__} at {user_location(exc)}: {first_line(exc)}",
            "the model module runs on import; fix the error there ($debug$)",
        ) from exc


def _get_dotted(obj: object, attr: str) -> object:
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def import_attribute(where: str, attr: str) -> object:
    return _attribute(import_module(where), where, attr)


def _attribute(module: ModuleType, where: str, attr: str) -> object:
    try:
        return _get_dotted(module, attr)
    except AttributeError:
        names = _names_to_offer(module)
        close = difflib.get_close_matches(attr, names, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"{where} defines: {_first_of(names, 12)}"
        raise UsageError(f"{where} has no attribute {attr!r}", hint) from None


def _names_to_offer(module: ModuleType) -> list[str]:
    """A module's public names as targets: its own functions first, then other callables, then the
    rest; modules and `from __future__` features left out."""
    own: list[str] = []
    other: list[str] = []
    rest: list[str] = []
    for name, value in sorted(vars(module).items()):
        if name.startswith("_") or isinstance(value, (ModuleType, _FEATURE)):
            continue
        if callable(value) and getattr(value, "__module__", None) == module.__name__:
            own.append(name)
        else:
            (other if callable(value) else rest).append(name)
    return own + other + rest


def _first_of(names: list[str], n: int) -> str:
    shown = ", ".join(names[:n])
    return f"{shown} and {len(names) - n} more" if len(names) > n else shown


def anchored(spec: str | None, what: str = "$inputs$") -> str | None:
    """`FILE.py:NAME` with FILE checked and made absolute now, before the target's module runs (its
    code may change the working folder); `module:NAME` as it is."""
    if spec is None:
        return None
    where, attr = split_target(spec, what)
    if not (where.endswith(".py") or os.sep in where or "/" in where):
        return spec
    if not Path(where).is_file():
        raise UsageError(f"no such file: {where}", "check the path; it is relative to the current folder")
    return f"{os.path.abspath(where)}:{attr}"


MAX_SOURCE_FILES = 200  # a model folder's own modules; a library's are not followed


def source_files(spec: str) -> tuple[Path, ...]:
    """The files a `FILE.py:NAME` or `package.module:NAME` spec runs, found without running them:
    its module, then the modules it imports from its own folder (and theirs), read by `ast`. An
    installed package's module is listed alone. Nothing where the spec names no file here (its load
    says why later).

    >>> [p.name for p in source_files("sample_models/mlp.py:loss")]  # doctest: +SKIP
    ['mlp.py']
    """
    where = spec.rpartition(":")[0] if ":" in spec else spec
    first = _module_file(where)
    if first is None:
        return ()
    found: dict[Path, None] = {}
    todo = [first]
    while todo and len(found) < MAX_SOURCE_FILES:
        path = todo.pop()
        if path in found:
            continue
        found[path] = None
        if not _installed(path):
            todo += [p for p in _imported_beside(path) if p not in found]
    return tuple(found)


def _module_file(where: str) -> Path | None:
    if where.endswith(".py") or os.sep in where or "/" in where:
        path = Path(where)
        return path.resolve() if path.is_file() else None
    search: list[str] | None = [os.getcwd(), *sys.path]
    origin = None
    for part in where.split("."):
        try:
            spec = importlib.machinery.PathFinder.find_spec(part, search)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        origin = spec.origin
        search = list(spec.submodule_search_locations or [])
    return Path(origin).resolve() if origin and os.path.isfile(origin) else None


def _installed(path: Path) -> bool:
    return bool({"site-packages", "dist-packages"} & set(path.parts)) or path.is_relative_to(sys.base_prefix)


def forget_user_modules() -> None:
    """Drop the user's modules (any module whose file is not installed, nor this tool's) from
    sys.modules, so that the next load imports them from the files as they are now."""
    for name, module in list(sys.modules.items()):
        if name == "__main__" or name.partition(".")[0] in ("te_ckpt_audit", "te_ckpt_audit_cli"):
            continue
        found = _file_of(module) if module is not None else ""
        if found and os.path.isfile(found) and not _installed(Path(found).resolve()):
            del sys.modules[name]


def _imported_beside(path: Path) -> list[Path]:
    """The files of `path`'s imports that lie in its folder or its package's: absolute names from
    its folder and from the folder above its packages, relative ones from its package."""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return []
    top = path.parent  # absolute names resolve from the folder above its packages, as `_import_file` puts it
    while (top / "__init__.py").exists() and top.parent != top:
        top = top.parent
    roots = [path.parent] if top == path.parent else [path.parent, top]
    names: list[tuple[Path, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(root, a.name.split(".")) for a in node.names for root in roots]
        elif isinstance(node, ast.ImportFrom):
            base = path.parent
            for _ in range(max(0, node.level - 1)):
                base = base.parent
            head = node.module.split(".") if node.module else []
            bases = [base] if node.level else roots
            names += [(b, [*head, a.name]) for a in node.names for b in bases]
            names += [(b, head) for b in bases if head]
    files = []
    for base, parts in names:
        for i in range(1, len(parts) + 1):
            stem = base.joinpath(*parts[:i])
            files += [f for f in (stem.with_suffix(".py"), stem / "__init__.py") if f.is_file()]
    return [f.resolve() for f in files]


def load_target(text: str) -> Target:
    """Import the module and fetch the function to audit.

    >>> t = load_target("sample_models/mlp.py:loss")  # doctest: +SKIP
    """
    where, attr = split_target(text, "target")
    module = import_module(where)
    fn = _attribute(module, where, attr)
    if not callable(fn):
        raise UsageError(
            f"{text} is {a_or_an(type(fn).__name__)}, not a function", "point TARGET at the function to differentiate"
        )
    return Target(fn, module, attr, text)


def find_inputs_callable(target: Target, inputs: str | None) -> tuple[Callable[..., object], str]:
    """`--inputs FILE:CALLABLE`, else `<attr>_inputs` beside the target, else `example_inputs`."""
    if inputs:
        where, attr = split_target(inputs, "$inputs$")
        fn = import_attribute(where, attr)
        if not callable(fn):
            raise UsageError(f"$inputs$ {inputs} is not callable", "name a function returning the arguments")
        return fn, inputs
    prefix, _, last = target.attr.rpartition(".")
    candidates = [f"{prefix + '.' if prefix else ''}{last}{INPUTS_SUFFIX}", FALLBACK_INPUTS]
    for name in candidates:
        try:
            fn = _get_dotted(target.module, name)
        except AttributeError:
            continue
        if callable(fn):
            return fn, f"{target.text.rpartition(':')[0]}:{name}"
    raise UsageError(
        f"no example inputs for {target.text}",
        f"define {candidates[0]}() beside it returning a tuple of arguments (jax.ShapeDtypeStruct "
        "pytrees), or pass $inputs$ FILE.py:CALLABLE",
    )


def parse_overrides(fn: Callable[..., object], defines: Defines) -> dict[str, object]:
    """`-D key=value` defines as keyword arguments of the inputs callable, typed by its defaults."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    known = {n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    out: dict[str, object] = {}
    for key, raw in defines.items():
        if key not in known and not takes_any:
            raise UsageError(
                f"$defines$ {key}: the inputs callable has no parameter {key!r}",
                f"it takes: {', '.join(sorted(known)) or 'no keyword parameters'}",
            )
        default = params[key].default if key in params else inspect.Parameter.empty
        out[key] = _convert(key, raw, default)
    return out


MAX_DEFINE_INT = 2**62  # an int define beyond this reached XLA as a shape and failed there, at each point


def _convert(key: str, raw: str, default: object) -> object:
    if isinstance(default, str):
        return raw
    if isinstance(default, bool) and raw.strip().lower() in ("true", "false"):  # -D named=false, as TOML spells it
        return raw.strip().lower() == "true"
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):  # the last two: deeply nested text
        if default is inspect.Parameter.empty or default is None:
            return raw
        kind = {int: "an int", float: "a number", bool: "a bool"}.get(type(default), type(default).__name__)
        raise UsageError(f"$defines$ {key}={raw[:80]}: not {kind}", f"the default is {default!r}") from None
    if isinstance(default, bool) and not isinstance(value, bool):
        raise UsageError(f"$defines$ {key}={raw}: not a bool", "use True or False")
    if isinstance(default, int) and not isinstance(default, bool) and not isinstance(value, int):
        raise UsageError(f"$defines$ {key}={raw}: not an int", f"the default is {default!r}")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_DEFINE_INT:
        # no array dimension or count is larger, and XLA's shapes take int64: a typo, not a model
        raise UsageError(f"$defines$ {key}={raw[:40]}: larger than {MAX_DEFINE_INT} (2**62)",
                         f"the default is {default!r}" if default is not inspect.Parameter.empty else "a smaller int")
    if isinstance(default, float) and not isinstance(value, int | float):
        raise UsageError(f"$defines$ {key}={raw}: not a number", f"the default is {default!r}")
    return float(value) if isinstance(default, float) else value


def load_inputs(
    target: Target, inputs: str | None = None, defines: Defines | None = None, mesh: Placement = None
) -> Inputs:
    """Call the inputs callable (with `-D` defines, and `mesh=` when it declares that parameter and
    a mesh is given) and return the positional arguments."""
    fn, source = find_inputs_callable(target, inputs)
    defines = defines or {}
    if mesh is not None and "mesh" in defines:
        raise UsageError(
            "$defines$ mesh: with a mesh, the inputs callable's `mesh` keyword is the mesh itself",
            "drop $defines$ mesh; give the mesh's shape with $mesh$ AXIS=SIZE,...",
        )
    kwargs = parse_overrides(fn, defines)
    try:
        takes_mesh = mesh is not None and "mesh" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_mesh = False
    try:
        value = fn(**kwargs, **({"mesh": mesh} if takes_mesh else {}))
    except Exception as exc:
        raise TargetError(
            f"inputs callable {source} raised {type(exc).__name__} at {user_location(exc)}: {first_line(exc)}",
            "fix the inputs callable ($debug$)",
        ) from exc
    args = value if isinstance(value, tuple) else (value,)
    _check_arity(target, args, source)
    return Inputs(args, source, tuple(sorted(kwargs.items())), {**_defaults(fn), **kwargs})


def _check_arity(target: Target, args: tuple[object, ...], source: str) -> None:
    """The inputs callable's arguments bind to the target's parameters, else the mistake is named
    where it is: in the inputs callable (a tuple of the wrong length), not in the model's code."""
    found = unbindable(target.fn, args)
    if found is not None:
        why, wanted = found
        got = f"{len(args)} argument{'s' * (len(args) != 1)}"
        raise TargetError(
            f"inputs callable {source} returned {got}, which {target.text} cannot take: {why}",
            f"return a tuple of its arguments from {source.rpartition(':')[2]}, e.g. ({', '.join(wanted)})",
        )


def _defaults(fn: Callable[..., object]) -> dict[str, object]:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    return {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}


def unbindable(fn: object, args: tuple[object, ...]) -> tuple[str, tuple[str, ...]] | None:
    """Why `fn(*args)` cannot bind (the reason, and `fn`'s required positional parameters), or
    None where it can or `fn` has no signature to tell."""
    try:
        signature = inspect.signature(fn)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*args)
    except TypeError as exc:
        wanted = tuple(n for n, p in signature.parameters.items()
                       if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty)
        return str(exc), wanted
    return None


def is_array_leaf(x: object) -> bool:
    return isinstance(x, jax.ShapeDtypeStruct | jax.Array | np.ndarray | np.generic)


def place_args(args: tuple[object, ...], mesh: Mesh | AbstractMesh) -> tuple[object, ...]:
    """`args` with every array leaf a ShapeDtypeStruct sharded on `mesh`: a leaf without a sharding
    is replicated; a NamedSharding must use the mesh's axes, each dividing the dimension it splits.
    Checked before tracing, so a wrong spec is named by input and dimension."""

    def place(path: tuple[KeyEntry, ...], leaf: Any) -> object:  # Any: an array leaf's shape and dtype
        if not is_array_leaf(leaf):
            return leaf
        name = "args" + jax.tree_util.keystr(path)
        try:  # a ShapeDtypeStruct resolves a bare PartitionSpec against the mesh only when asked
            sharding = getattr(leaf, "sharding", None) if isinstance(leaf, jax.ShapeDtypeStruct | jax.Array) else None
        except ValueError as exc:  # an axis the mesh does not have: JAX's message names it
            hint = "use the mesh's axes, or add AXIS=SIZE to $mesh$"
            raise UsageError(f"input {name}: {str(exc).strip()}", hint) from None
        if sharding is None or (not isinstance(sharding, NamedSharding) and sharding.is_fully_replicated):
            spec = PartitionSpec()
        elif isinstance(sharding, NamedSharding):
            spec = sharding.spec
        else:
            raise UsageError(
                f"input {name} has a {type(sharding).__name__}; on a mesh an input's sharding is a NamedSharding",
                "return ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(...)))",
            )
        shape = tuple(int(d) for d in np.shape(leaf))
        _check_spec(name, shape, spec, mesh, sharding)
        weak = bool(getattr(leaf, "weak_type", False))
        return jax.ShapeDtypeStruct(shape, leaf.dtype, weak_type=weak, sharding=NamedSharding(mesh, spec))

    return tuple(jax.tree_util.tree_map_with_path(place, args, is_leaf=is_array_leaf))


def replicated_over(args: tuple[object, ...], mesh: Mesh | AbstractMesh) -> tuple[str, ...]:
    """The mesh's axes of more than one device when no input of `args` (placed by `place_args`)
    is sharded over any of them (every device then holds every input whole: the batch too); else ()."""
    wide = tuple(name for name, size in mesh.shape.items() if size > 1)
    for leaf in jax.tree_util.tree_leaves(args, is_leaf=is_array_leaf):
        sharding = getattr(leaf, "sharding", None) if isinstance(leaf, jax.ShapeDtypeStruct) else None
        if isinstance(sharding, NamedSharding):
            named = {a for entry in sharding.spec if entry is not None
                     for a in ((entry,) if isinstance(entry, str) else entry)}
            if named & set(wide):
                return ()
    return wide


def _check_spec(
    name: str, shape: tuple[int, ...], spec: PartitionSpec, mesh: Mesh | AbstractMesh, sharding: Sharding | None
) -> None:
    sizes = dict(mesh.shape)
    own = getattr(sharding, "mesh", None)
    if own is not None and tuple(own.axis_names) != tuple(sizes):
        extra = [a for a in own.axis_names if a not in sizes]
        raise UsageError(
            f"input {name} is sharded on a mesh with axes {tuple(own.axis_names)}, not this mesh's {tuple(sizes)}"
            + (f" (axis {extra[0]!r} is not in the mesh)" if extra else ""),
            "build the sharding from the `mesh` keyword the inputs callable is given",
        )
    if len(spec) > len(shape):
        raise UsageError(f"input {name}: {spec} has {len(spec)} entries for {len(shape)} dimensions",
                         "give one PartitionSpec entry per dimension at most")
    for dim, entry in enumerate(spec):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        for axis in axes:
            if axis not in sizes:
                raise UsageError(
                    f"input {name}: axis {axis!r} of {spec} is not in the mesh ({', '.join(sizes)})",
                    f"use the mesh's axes, or add {axis}=SIZE to $mesh$",
                )
            if own is not None and dict(own.shape)[axis] != sizes[axis]:
                raise UsageError(
                    f"input {name}: its mesh has {axis}={dict(own.shape)[axis]}, this mesh {axis}={sizes[axis]}",
                    "build the sharding from the `mesh` keyword the inputs callable is given",
                )
        parts = math.prod(sizes[a] for a in axes)
        if shape[dim] % parts:
            over = " x ".join(f"{a}={sizes[a]}" for a in axes)
            raise UsageError(
                f"input {name}: dimension {dim} (size {shape[dim]}) is not divisible by mesh axis {over}",
                "choose sizes the mesh divides (a $defines$ value, or the $mesh$ sizes)",
            )

"""The Python API's arguments checked at its door: a wrong type is a UsageError that names the
parameter and what it takes, never an AttributeError from deep inside (the command line's values
are typed already; these are for callers in Python and notebooks)."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from .errors import UsageError

_R = TypeVar("_R")

if TYPE_CHECKING:  # imported where used: this module comes before them
    from .gpus import GpuRequest
    from .records import MeshSpec
    from .tpus import TpuRequest


def _kind(value: object) -> str:
    return f"{type(value).__name__} {value!r}"[:80]


def check_target_arg(target: object, what: str = "target") -> str:
    """A target as `file.py:fn` or `package.module:fn` text."""
    if not isinstance(target, str):
        raise UsageError(f"${what}$ takes text, FILE.py:NAME or package.module:NAME, not {_kind(target)}",
                         "e.g. 'model.py:loss'; audit(fn, *args) takes the function itself")
    return target


def mesh_arg(mesh: object) -> MeshSpec | None:
    """A mesh as a MeshSpec, its text ("data=8,model=4"), or None."""
    from .config import parse_mesh
    from .records import MeshSpec

    if mesh is None or isinstance(mesh, MeshSpec):
        return mesh
    if isinstance(mesh, str):
        return parse_mesh(mesh)
    raise UsageError(f"$mesh$ takes text such as 'data=8,model=4' (or a MeshSpec), not {_kind(mesh)}",
                     "e.g. $mesh$='data=8'")


def tpu_arg(tpu: object) -> TpuRequest | None:
    """A TPU as a TpuRequest, or None."""
    from .tpus import TpuRequest

    return _request(tpu, TpuRequest, "tpu", "TpuRequest(parse_tpu('v5e')), from te_ckpt_audit.tpus")


def gpu_arg(gpu: object) -> GpuRequest | None:
    """A GPU as a GpuRequest, or None."""
    from .gpus import GpuRequest

    return _request(gpu, GpuRequest, "gpu", "GpuRequest(gpu_model('h100')), from te_ckpt_audit.gpus")


def _request(value: object, kind: type[_R], name: str, example: str) -> _R | None:
    """`value` if it is None or a `kind`; else a UsageError whose hint shows how to make one."""
    if value is None or isinstance(value, kind):
        return value
    module = example.split(", from ")[1]
    hint = f"e.g. ${name}$={example}" if isinstance(value, str) else f"a {kind.__name__} ({module})"
    raise UsageError(f"${name}$ takes a {kind.__name__}, not {_kind(value)}", hint)

"""The Python API's arguments checked at its door: a wrong type is a UsageError that names the
parameter and what it takes, never an AttributeError from deep inside (the command line's values
are typed already; these are for callers in Python and notebooks)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import UsageError

if TYPE_CHECKING:  # imported where used: this module comes before them
    from .gpus import GpuRequest
    from .records import MeshSpec


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


def gpu_arg(gpu: object) -> GpuRequest | None:
    """A GPU as a GpuRequest, or None."""
    from .gpus import GpuRequest

    if gpu is None or isinstance(gpu, GpuRequest):
        return gpu
    hint = ("e.g. $gpu$=GpuRequest(gpu_model('h100')), from te_ckpt_audit.gpus" if isinstance(gpu, str)
            else "a GpuRequest (te_ckpt_audit.gpus)")
    raise UsageError(f"$gpu$ takes a GpuRequest, not {_kind(gpu)}", hint)

"""Findings: one frozen record per kind of warning, each with the fields it means and its code
(`WarningCode`); renderers word them. In the JSON document every finding keeps the flat shape
warnings have had since te-ckpt-audit/2 (`warning_document`)."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, ClassVar, TypeAlias


class WarningCode(enum.StrEnum):
    """Policies that silently do nothing, or not what their name promises."""

    TE_GEMMS_RECOMPUTED = "te-gemms-recomputed"  # a dot policy recomputes every TE GEMM
    SAME_AS_NOTHING_SAVEABLE = "same-as-nothing-saveable"  # it checkpoints nothing in this model
    UNKNOWN_NAME = "unknown-name"  # a name policy names no checkpoint_name of the model (a typo)
    SAVES_EVERYTHING = "saves-everything"  # jax's save_anything_except_these_names ignores its names
    OFFLOAD_MISSING = "offload-missing"  # an offload policy offloads nothing
    INNER_SCOPE_WITHOUT_CHECKPOINTS = "inner-scope-without-checkpoints"  # --scope inner, no checkpoints
    REMAT3 = "remat3"  # jax_remat3 is on: the figures are the new remat's
    REMAT3_CHANGES_POLICY = "remat3-changes-policy"  # JAX's new remat saves other things under the policy
    TE_REQUANTIZED = "te-requantized"  # TE quantizations run again in the backward pass
    GEMM_BATCH_DIMS_MISSED = "gemm-batch-dims-missed"  # a no-batch-dims dot policy recomputes batched weight GEMMs
    INPUTS_REPLICATED = "inputs-replicated"  # a mesh, and no input sharded over it: every device holds all


# --- findings: one frozen record per warning, each with the fields it means ------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class TeGemmsRecomputed:
    """A dot policy recomputes every TE GEMM: JAX's dot policies do not know TE's primitives."""

    policy: str
    equations: tuple[str, ...]  # the TE GEMMs recomputed
    flops: int  # their recompute FLOPs
    code: ClassVar[WarningCode] = WarningCode.TE_GEMMS_RECOMPUTED


@dataclasses.dataclass(frozen=True, slots=True)
class SameAsNothingSaveable:
    """The policy saves exactly what nothing_saveable saves: it checkpoints nothing in this model."""

    policy: str
    code: ClassVar[WarningCode] = WarningCode.SAME_AS_NOTHING_SAVEABLE


@dataclasses.dataclass(frozen=True, slots=True)
class UnknownName:
    """A name policy names a checkpoint name the model does not have (a typo)."""

    policy: str
    name: str
    closest: str | None  # the model's name closest to it
    model_names: tuple[str, ...]  # every checkpoint name the model has
    line: str | None = None  # "file:line" of the model's code whose name `--name-lines` spells so (`mlp_26`)
    code: ClassVar[WarningCode] = WarningCode.UNKNOWN_NAME


@dataclasses.dataclass(frozen=True, slots=True)
class SavesEverything:
    """jax's save_anything_except_these_names ignores its names and saves everything."""

    policy: str
    code: ClassVar[WarningCode] = WarningCode.SAVES_EVERYTHING


@dataclasses.dataclass(frozen=True, slots=True)
class OffloadMissing:
    """An offload policy offloads nothing in this model."""

    policy: str
    code: ClassVar[WarningCode] = WarningCode.OFFLOAD_MISSING


@dataclasses.dataclass(frozen=True, slots=True)
class InnerScopeWithoutCheckpoints:
    """The policy is applied to the model's own checkpoints, and it has none."""

    policy: str
    code: ClassVar[WarningCode] = WarningCode.INNER_SCOPE_WITHOUT_CHECKPOINTS


@dataclasses.dataclass(frozen=True, slots=True)
class Remat3:
    """jax_remat3 is on: the figures are those of JAX's new remat, which saves by other rules."""

    policy: str
    code: ClassVar[WarningCode] = WarningCode.REMAT3


@dataclasses.dataclass(frozen=True, slots=True)
class Remat3ChangesPolicy:
    """JAX's new remat (`jax_remat3`) saves other things than the current one under the policy:
    the equations whose outcome differs, the activation bytes under each, and the TE GEMMs it
    recomputes where the current remat saves them (`custom_vjp3`: whether turning on
    `jax_custom_vjp3` too is what would keep them)."""

    policy: str
    equations: tuple[str, ...]  # saved or offloaded under one implementation and not the other
    remat_bytes: int  # activation bytes saved under the current remat
    remat3_bytes: int  # under jax_remat3
    te_gemms: tuple[str, ...]  # TE GEMMs saved now and recomputed under remat3
    code: ClassVar[WarningCode] = WarningCode.REMAT3_CHANGES_POLICY


@dataclasses.dataclass(frozen=True, slots=True)
class TeRequantized:
    """TE quantizations run again in the backward pass."""

    policy: str
    equations: tuple[str, ...]  # the quantizations recomputed
    flops: int
    modules: tuple[str, ...]  # where they are (module path, else line)
    quantizer_names: tuple[str, ...]  # the quantizers' checkpoint names in the model
    saving_spec: str | None  # a spec that saves them with the GEMM outputs
    delayed: bool  # delayed scaling: the forward quantize updates the amax history, so it runs again anyway
    runs: int  # how many times they run again: each counted once per run (a scanned layer's, per layer)
    kept_bytes: int = 0  # under delayed scaling: the quantized tensors the policy keeps all the same
    maxtext_policy: str | None = None  # for a MaxText model: the remat_policy that saves the quantizers
    unspellable: tuple[str, ...] = ()  # quantizer names no --policy spec can carry (`,` `+` `;` `|` `=`, spaces)
    code: ClassVar[WarningCode] = WarningCode.TE_REQUANTIZED


@dataclasses.dataclass(frozen=True, slots=True)
class GemmBatchDimsMissed:
    """A no-batch-dims dot policy recomputes weight GEMMs that have batch dimensions."""

    policy: str
    equations: tuple[str, ...]
    flops: int
    modules: tuple[str, ...]  # where they are (module path, else line)
    origins: tuple[str, ...]  # where their batch dimensions came from (vmap, einsum, dot_general)
    code: ClassVar[WarningCode] = WarningCode.GEMM_BATCH_DIMS_MISSED


@dataclasses.dataclass(frozen=True, slots=True)
class InputsReplicated:
    """A mesh is given and no input is sharded over any of its axes: every device holds the whole
    batch, so the per-device figures are the whole model's, not a data-parallel run's. A finding
    of the audit, not of one policy (`policy` is empty)."""

    mesh: str  # the mesh, as given (data=8)
    axes: tuple[str, ...]  # its axes of more than one device
    policy: str = ""
    code: ClassVar[WarningCode] = WarningCode.INPUTS_REPLICATED


AuditWarning: TypeAlias = (
    TeGemmsRecomputed | SameAsNothingSaveable | UnknownName | SavesEverything | OffloadMissing
    | InnerScopeWithoutCheckpoints | Remat3 | TeRequantized | GemmBatchDimsMissed | InputsReplicated
    | Remat3ChangesPolicy
)
WARNINGS = (TeGemmsRecomputed, SameAsNothingSaveable, UnknownName, SavesEverything, OffloadMissing,
            InnerScopeWithoutCheckpoints, Remat3, TeRequantized, GemmBatchDimsMissed, InputsReplicated,
            Remat3ChangesPolicy)


def warning_document(w: AuditWarning) -> dict[str, Any]:
    """A finding as the JSON document has held every warning since te-ckpt-audit/2: one flat
    object of the code, the policy and every field any warning has (unused ones empty)."""
    doc: dict[str, Any] = {"code": w.code.value, "policy": w.policy, "equations": [], "flops": None, "name": None,
                           "suggestion": None, "known": [], "modules": [], "origins": []}
    match w:
        case TeGemmsRecomputed(_, equations, flops):
            doc.update(equations=list(equations), flops=flops)
        case UnknownName(_, name, closest, model_names, line):
            doc.update(name=name, suggestion=closest, known=list(model_names), origins=[line] if line else [])
        case TeRequantized(_, equations, flops, modules, names, saving, delayed):
            doc.update(equations=list(equations), flops=flops, modules=list(modules), known=list(names),
                       suggestion=saving, name="delayed" if delayed else None)
        case GemmBatchDimsMissed(_, equations, flops, modules, origins):
            doc.update(equations=list(equations), flops=flops, modules=list(modules), origins=list(origins))
        case InputsReplicated(mesh, axes):
            doc.update(name=mesh, known=list(axes))
        case Remat3ChangesPolicy(_, equations, _, _, te_gemms):  # the bytes: the report's `remat3` rows
            doc.update(equations=list(equations), known=list(te_gemms))
    return doc

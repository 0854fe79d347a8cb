"""The JSON Schema (draft 2020-12) of the audit's JSON document, ``te-ckpt-audit/10``: what
`AuditReport.to_dict()` gives, plus the hotspots and each warning's words that the JSON renderer
adds. The tests validate every sample model's document against it."""

from __future__ import annotations

from typing import Any

from .audit import (
    SCHEMA,
    Category,
    HotspotKey,
    KernelKind,
    Outcome,
    ResidualKind,
    Scope,
    ShardingSource,
    TeKind,
    Verdict,
)
from .findings import WarningCode


def _object(**properties: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _enum(members: type[Any]) -> dict[str, Any]:
    return {"enum": [m.value for m in members]}


_INT = {"type": "integer", "minimum": 0}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_OPT_STR = {"type": ["string", "null"]}
_OPT_INT = {"oneOf": [{"type": "null"}, _INT]}
_SHAPE = {"type": "array", "items": _INT}
_FRACTION = {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
_SECONDS = {"type": "number", "minimum": 0}
_OPT_SECONDS = {"oneOf": [{"type": "null"}, _SECONDS]}
_OPT_NUMBER = {"oneOf": [{"type": "null"}, {"type": "number", "minimum": 0}]}
_SOURCE = {
    "oneOf": [{"type": "null"}, _object(file=_STR, line=_INT, function=_STR)],
}


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


_WARNINGS = _array(_object(
    code=_enum(WarningCode), policy=_OPT_STR, equations=_array(_STR), flops=_OPT_INT, name=_OPT_STR,
    suggestion=_OPT_STR, known=_array(_STR), modules=_array(_STR), origins=_array(_STR), message=_STR,
))

JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA,
    "title": "te-ckpt-audit report",
    **_object(
        schema={"const": SCHEMA},
        hotspots=_object(
            by=_enum(HotspotKey),
            rows=_array(_object(where=_STR, producers=_array(_STR), bytes_by_policy=_array(_INT))),
        ),
        target=_STR,
        arguments=_array(_STR),
        jax_version=_STR,
        te=_enum(TeKind),
        equations=_array(
            _object(
                id=_STR,
                primitive=_STR,
                shape=_SHAPE,
                dtype=_STR,
                name=_OPT_STR,
                source=_SOURCE,
                frame=_SOURCE,
                module=_OPT_STR,
                is_te_gemm=_BOOL,
                standin=_BOOL,
                flops=_INT,
                multiplicity=_INT,
                is_te_quantize=_BOOL,
            )
        ),
        results=_array(
            _object(
                policy=_STR,
                scope={"enum": [Scope.OUTER.value, Scope.INNER.value]},
                residuals=_array(
                    _object(
                        shape=_SHAPE,
                        dtype=_STR,
                        bytes=_INT,
                        kind=_enum(ResidualKind),
                        category=_enum(Category),
                        primitive=_OPT_STR,
                        name=_OPT_STR,
                        equation=_OPT_STR,
                        source=_SOURCE,
                        frame=_SOURCE,
                        module=_OPT_STR,
                        multiplicity=_INT,
                        argument=_OPT_STR,
                        standin=_BOOL,
                        sharding=_OPT_STR,
                        bytes_per_device=_OPT_INT,
                        quantized=_BOOL,
                        scale_of=_OPT_STR,
                    )
                ),
                totals=_object(
                    **{
                        f: _INT
                        for f in (
                            "activation_bytes",
                            "argument_bytes",
                            "host_bytes",
                            "constant_bytes",
                            "te_gemm_bytes",
                            "dot_bytes",
                            "named_bytes",
                            "other_bytes",
                            "total_bytes",
                        )
                    },
                    activation_bytes_per_device=_OPT_INT,
                    quantized_bytes=_INT,
                ),
                marks=_array(_object(equation=_STR, verdict=_enum(Verdict), outcome=_enum(Outcome))),
                recompute_flops=_INT,
                forward_flops=_INT,
                warnings=_WARNINGS,
                compiled={
                    "oneOf": [
                        {"type": "null"},
                        _object(
                            backend=_STR,
                            temp_bytes=_OPT_INT,
                            argument_bytes=_OPT_INT,
                            output_bytes=_OPT_INT,
                            host_bytes=_OPT_INT,
                            error=_OPT_STR,
                        ),
                    ]
                },
                peak={
                    "oneOf": [
                        {"type": "null"},
                        _object(
                            bytes_per_device=_OPT_INT,
                            bytes_per_device_min=_OPT_INT,
                            argument_bytes=_OPT_INT,
                            output_bytes=_OPT_INT,
                            alias_bytes=_OPT_INT,
                            temp_bytes=_OPT_INT,
                            fits={"type": ["boolean", "null"]},
                            xla_rematerialized=_BOOL,
                            needed_bytes=_OPT_INT,
                            compile_seconds={"type": "number", "minimum": 0},
                            error=_OPT_STR,
                            least_fraction={"oneOf": [{"type": "null"},
                                                      {"type": "number", "exclusiveMinimum": 0, "maximum": 1}]},
                            backends=_array({"enum": ["triton", "cublas"]}),
                        ),
                    ]
                },
                requantized=_INT,
                requantize_flops=_INT,
                requantized_equations=_array(_STR),
                error=_OPT_STR,
                audited=_BOOL,
                time={
                    "oneOf": [
                        {"type": "null"},
                        _object(
                            seconds=_OPT_SECONDS, seconds_low=_OPT_SECONDS, seconds_high=_OPT_SECONDS,
                            compute_seconds=_SECONDS, communication_seconds=_SECONDS,
                            exposed_communication_seconds=_SECONDS, kernels=_INT, hlo_flops=_INT, model_flops=_INT,
                            recompute_flops=_INT, peak_flops={"type": "number", "minimum": 0}, tokens=_OPT_INT,
                            devices={"type": "integer", "minimum": 1},
                            costliest=_array(_object(
                                name=_STR, kind=_enum(KernelKind), seconds=_SECONDS,
                                runs={"type": "integer", "minimum": 1}, flops=_INT, bytes=_INT, basis=_STR,
                                source=_STR, total_seconds=_SECONDS,
                            )),
                            model=_STR, compile_seconds=_SECONDS, error=_OPT_STR, gemm_seconds=_SECONDS,
                            attention_seconds=_SECONDS, mfu=_OPT_NUMBER, hfu=_OPT_NUMBER,
                            tokens_per_second_per_gpu=_OPT_NUMBER, tflops_per_gpu=_OPT_NUMBER,
                            examples={"oneOf": [{"type": "null"}, _INT]}, examples_per_second_per_gpu=_OPT_NUMBER,
                            device={"enum": ["GPU", "chip"]}, hardware=_STR, estimator=_STR,
                            floor_seconds=_SECONDS, floor_kernels=_INT, unestimated=_array(_STR),
                            overhead_seconds=_SECONDS, host_seconds=_SECONDS, exposed_host_seconds=_SECONDS,
                            host_link={"type": "number", "minimum": 0}, dispatch_seconds=_SECONDS,
                            calibration={"oneOf": [{"type": "null"}, _object(
                                profile=_STR, instructions=_INT, measured=_INT, missing=_INT,
                                ratios=_array({"type": "array", "prefixItems": [_enum(KernelKind),
                                                                                {"type": "number", "minimum": 0}],
                                               "minItems": 2, "maxItems": 2}),
                                estimated_seconds=_SECONDS,
                            )]},
                        ),
                    ]
                },
                tpu_plan={"oneOf": [{"type": "null"}, _object(
                    fits={"oneOf": [{"type": "null"}, _BOOL]}, required_bytes=_OPT_INT, argument_bytes=_OPT_INT,
                    output_bytes=_OPT_INT, alias_bytes=_OPT_INT, temp_bytes=_OPT_INT, compile_seconds=_SECONDS,
                    error=_OPT_STR, plan_bytes=_OPT_INT,
                )]},
                recompute_percent={"type": "number", "minimum": 0},
            )
        ),
        forward_flops=_INT,
        emulated_device=_OPT_STR,
        mesh={
            "oneOf": [
                {"type": "null"},
                _object(axes=_array(_object(name=_STR, size={"type": "integer", "minimum": 1})), devices=_INT),
            ]
        },
        sharding_source={"oneOf": [{"type": "null"}, _enum(ShardingSource)]},
        gpu={
            "oneOf": [
                {"type": "null"},
                _object(
                    name=_STR, memory_bytes=_INT, usable_bytes=_INT, gpus_per_host={"type": "integer", "minimum": 1},
                    mem_fraction=_FRACTION, fraction_source={"enum": ["default", "environment", "given"]},
                    fraction_variable=_OPT_STR, max_fraction=_FRACTION, reserved_bytes=_INT, allocator=_STR,
                    preallocate=_BOOL, xla_flags=_STR, mesh=_OPT_STR,
                    mesh_source={"enum": [None, "given", "model"]},
                ),
            ]
        },
        step={"oneOf": [{"type": "null"}, _object(optimizer=_OPT_STR, donated=_array(_STR), own=_BOOL,
                                                   state_bytes={"oneOf": [{"type": "null"}, _INT]})]},
        trained={
            "oneOf": [
                {"type": "null"},
                _object(arguments={"oneOf": [{"type": "null"}, _array(_INT)]}, inputs=_array(_STR), convention=_BOOL),
            ]
        },
        findings=_WARNINGS,
        tpu={"oneOf": [{"type": "null"}, _object(
            name=_STR, topology=_STR, chips={"type": "integer", "minimum": 1}, hbm_bytes=_INT, usable_bytes=_INT,
            libtpu=_OPT_STR, mesh=_OPT_STR,
        )]},
        remat={"enum": ["remat", "remat3"]},
        remat3=_array(_object(
            policy=_STR, remat_bytes=_INT, remat3_bytes=_INT, remat_te_gemm_bytes=_INT, remat3_te_gemm_bytes=_INT,
            remat_recompute_flops=_INT, remat3_recompute_flops=_INT, error=_OPT_STR, changed=_BOOL,
        )),
    ),
}

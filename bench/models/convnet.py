"""A small ResNet-style network (bf16 NHWC convolutions, residual blocks, unrolled): a step of many
small kernels for bench/tpu_small.py. Not a sample model: the tests do not audit it."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

Params = dict[str, Any]


def _conv(x: jax.Array, w: jax.Array, stride: int = 1) -> jax.Array:
    return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        preferred_element_type=jnp.float32).astype(x.dtype)


def loss(params: Params, images: jax.Array) -> jax.Array:
    x = jax.nn.relu(_conv(images, params["stem"], 2))
    for stage in params["stages"]:
        for k, block in enumerate(stage):
            stride = 2 if k == 0 and "down" in block else 1
            h = jax.nn.relu(_conv(x, block["a"], stride))
            h = _conv(h, block["b"])
            skip = _conv(x, block["down"], stride) if "down" in block else x
            x = jax.nn.relu(h + skip)
    pooled = jnp.mean(x.astype(jnp.float32), axis=(1, 2))
    logits = pooled @ params["head"].astype(jnp.float32)
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[:, 0])


def loss_inputs(batch: int = 32, image: int = 64, widths: str = "64,128,256,512",
                blocks: str = "3,4,6,3") -> tuple[Params, jax.ShapeDtypeStruct]:
    """ResNet-34's stage layout by default (3, 4, 6, 3 blocks); shapes only."""
    sds, bf16 = jax.ShapeDtypeStruct, jnp.bfloat16
    ws = [int(w) for w in widths.split(",")]
    stages, prev = [], ws[0]
    for i, (width, count) in enumerate(zip(ws, (int(b) for b in blocks.split(",")), strict=True)):
        stage = []
        for k in range(count):
            block = {"a": sds((3, 3, prev, width), bf16), "b": sds((3, 3, width, width), bf16)}
            if k == 0 and (i > 0 or prev != width):
                block["down"] = sds((1, 1, prev, width), bf16)
            stage.append(block)
            prev = width
        stages.append(stage)
    params = {"stem": sds((7, 7, 3, ws[0]), bf16), "stages": stages, "head": sds((prev, 1000), bf16)}
    return params, sds((batch, image, image, 3), bf16)

"""What the MaxText tests compare with: MaxText's train step lowered as its own ahead-of-time
compile lowers it (`train_compile.get_shaped_inputs`, `get_functional_train_with_signature`, jit
with its shardings), on a mesh of the target's devices (GPUs: tests/test_maxtext.py; a TPU slice:
tests/test_maxtext_tpu.py)."""

from __future__ import annotations

from typing import Any

import jax


def maxtexts_own_plan(config: Any, mesh: Any, compiler_options: dict[str, Any] | None = None) -> Any:
    """The memory analysis of MaxText's train step for `config` (its HyperParameters) on `mesh`."""
    from flax.core.spmd import logical_axis_rules
    from maxtext.trainers.pre_train import train, train_compile
    from maxtext.utils import maxtext_utils, sharding

    with jax.numpy_dtype_promotion("standard"):  # MaxText's (the tests run strict)
        args, kwargs, state_shardings, _, model = train_compile.get_shaped_inputs(mesh, config)
    params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(config, state_shardings)
    state_in = sharding.build_zero1_input_state_mesh_shardings(config, state_shardings, params_shardings)
    data = sharding.get_input_data_sharding(config, mesh)
    fn, in_shard, out_shard, static, donate = maxtext_utils.get_functional_train_with_signature(
        train.train_step, data, state_in, model, config, params_shardings)
    with jax.set_mesh(mesh), logical_axis_rules(config.logical_axis_rules), jax.numpy_dtype_promotion("standard"):
        lowered = jax.jit(fn, in_shardings=in_shard, out_shardings=out_shard, static_argnums=static,
                          donate_argnums=donate).lower(*args, **kwargs)
    return lowered.compile(compiler_options=compiler_options).memory_analysis()

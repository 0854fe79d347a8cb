"""MaxText's own train step with Transformer Engine's FP8 (`quantization=te_fp8_currentscaling`),
compiled for an H100 (issue 28): real TE traced on the emulated GPU (`te_cpu/`), its partitioners
run inside XLA's compile with MaxText's mesh axes and the step's mesh. The te-newest lane runs it
(jax 0.12: a GPU target; MaxText installed by te_cpu/test.sh)."""

from __future__ import annotations

import importlib.util
import os

import pytest

from te_ckpt_audit._jax_compat import GPU_TARGET_SINCE, JAX_VERSION
from te_ckpt_audit.gpus import GpuEnvironment, GpuRequest, gpu_model

pytestmark = [pytest.mark.te, *(pytest.mark.filterwarnings(f"ignore::{kind}") for kind in
                                ("DeprecationWarning", "UserWarning", "FutureWarning"))]
WHY = ("jax < 0.12" if JAX_VERSION < GPU_TARGET_SINCE else
       "maxtext is not installed" if importlib.util.find_spec("maxtext") is None else
       "transformer_engine is not installed" if importlib.util.find_spec("transformer_engine") is None else None)
# one A3 host: 8 GPUs (8 virtual CPU devices: te_cpu/test.sh runs this file with them)
TINY = ("base_emb_dim=128", "base_num_query_heads=4", "base_num_kv_heads=4", "head_dim=32", "base_mlp_dim=256",
        "base_num_decoder_layers=2", "vocab_size=256", "max_target_length=32", "per_device_batch_size=2",
        "attention=dot_product", "scan_layers=True", "hardware=gpu", "ici_fsdp_parallelism=8",
        "quantization=te_fp8_currentscaling")


@pytest.mark.skipif(WHY is not None, reason=f"cannot compile MaxText with TE here: {WHY}")
def test_maxtexts_fp8_step_compiles_and_saving_the_quantizers_costs_their_bytes() -> None:
    import maxtext.configs

    from te_ckpt_audit.maxtext import MaxTextRun, audit_maxtext

    base = os.path.join(os.path.dirname(maxtext.configs.__file__), "base.yml")
    run = MaxTextRun(base, TINY)
    request = GpuRequest(gpu_model("h100"), environment=GpuEnvironment(xla_flags="--xla_gpu_enable_triton_gemm=false"))
    report = audit_maxtext(run, ["minimal", "minimal_with_quantization"], request)
    minimal, saving = (r.peak for r in report.results)
    assert minimal is not None and saving is not None
    assert minimal.error is None and saving.error is None, (minimal.error, saving.error)
    assert minimal.argument_bytes == saving.argument_bytes  # the same train state
    assert saving.temp_bytes > minimal.temp_bytes  # it keeps the quantized tensors for the backward pass

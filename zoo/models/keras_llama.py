"""KerasHub's Llama causal LM (grouped-query attention, RoPE, SwiGLU) on the JAX backend, as
`keras_gpt2` is built and hooked."""

from __future__ import annotations

from zoo.models import _keras

REQUIRES = "keras_hub"

loss, make_loss, loss_inputs = _keras.causal_lm(
    "Llama", num_query_heads=4, num_key_value_heads=2, hidden_dim=64, intermediate_dim=128
)

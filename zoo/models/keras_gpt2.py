"""KerasHub's GPT-2 causal LM on the JAX backend, its activations under Keras' remat and its
policy set through Keras' backend (`_keras` says how)."""

from __future__ import annotations

from zoo.models import _keras

REQUIRES = "keras_hub"

loss, make_loss, loss_inputs = _keras.causal_lm(
    "GPT2", num_heads=4, max_sequence_length=_keras.SEQ, hidden_dim=64, intermediate_dim=128
)

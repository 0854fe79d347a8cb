"""KerasHub's Llama causal LM (grouped-query attention, RoPE, SwiGLU) on the JAX backend,
two layers, dropout 0.1, activations under Keras' remat (``keras.RematScope``). ``make_loss(policy)``
sets the policy through Keras' backend remat (``_keras.remat_set_to``). Keras builds its variables
eagerly; the target sees them as ShapeDtypeStructs."""

from __future__ import annotations

from zoo.models import _keras

REQUIRES = "keras_hub"

import keras_hub  # noqa: E402

_MODEL = _keras.build(
    lambda: keras_hub.models.LlamaBackbone(
        vocabulary_size=_keras.VOCAB,
        num_layers=_keras.LAYERS,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=64,
        intermediate_dim=128,
        dropout=0.1,
    ),
    keras_hub.models.LlamaCausalLM,
)
loss, make_loss, loss_inputs = _keras.targets(_MODEL)

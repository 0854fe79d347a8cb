"""KerasHub's GPT-2 causal LM on the JAX backend,
two layers, dropout 0.1, activations under Keras' remat (``keras.RematScope``). ``make_loss(policy)``
sets the policy through Keras' backend remat (``_keras.remat_set_to``). Keras builds its variables
eagerly; the target sees them as ShapeDtypeStructs."""

from __future__ import annotations

from zoo.models import _keras

REQUIRES = "keras_hub"

import keras_hub  # noqa: E402

_MODEL = _keras.build(
    lambda: keras_hub.models.GPT2Backbone(
        vocabulary_size=_keras.VOCAB,
        num_layers=_keras.LAYERS,
        num_heads=4,
        max_sequence_length=_keras.SEQ,
        hidden_dim=64,
        intermediate_dim=128,
        dropout=0.1,
    ),
    keras_hub.models.GPT2CausalLM,
)
loss, make_loss, loss_inputs = _keras.targets(_MODEL)

"""Real models from JAX libraries, each a target for te-ckpt-audit.

Every module has the same shape:

- ``loss(*inputs)``: the model in training mode (dropout on), with its own remat as the library
  sets it up: the target, audited as ``zoo/models/NAME.py:loss``.
- ``loss_inputs()``: its example arguments, parameters as ``jax.ShapeDtypeStruct`` (nothing is
  allocated where the library allows it, nothing is downloaded).
- ``make_loss(policy)``: the same target with the model's own remat set to ``policy`` through the
  model's own hook; ``None`` removes remat (plain autodiff). The zoo's tests compare te-ckpt-audit
  against JAX's ``saved_residuals`` of this function.
- ``REQUIRES``: the library the model needs (the zoo skips a model whose library is not installed
  in this environment, e.g. MaxText on Python < 3.12).
"""

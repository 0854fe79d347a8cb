"""Small real models that te-ckpt-audit's README and tests audit.

Each module holds a target (``loss``), its inputs callable (``loss_inputs``) and
``make_loss(...)``, so the CLI's default "inputs beside the target" convention works.
"""

"""The first stage: a target loaded and traced once.

Enters: a target (`path/to/file.py:attr` or a function) and its example inputs (the inputs
callable beside it, `-D` keywords, a mesh), through one door: `trace_target` (`trace_function`).
Leaves: one `Loaded` (`_trace`): a `Traced` (the closed jaxpr, every equation tagged with an id,
its source line, module path and call site, the trained inputs, and the user's pytree structure)
with the mesh its inputs were placed on; every later stage reads it and none traces again.

    _loading   import the user's file or module under the tool's rules, call the inputs callable,
               place what it returns on the mesh
    _devices   the mesh: virtual CPU devices or an abstract one, and JAX's context mesh
    _source    where an equation comes from: the user's frame, the innermost frame, module paths
    _trace     trace once, tag every equation (`Traced`, `Rows`)
    _naming    the tool's own checkpoint names on the matmul lines of a model without any (--name-lines)
    _trained   which arguments are trained (`--params`), by position or name
    _params    module paths of parameters (Flax, Equinox, Keras) for residuals kept alive
    _sites     one shared jit body's call sites, each with its own module path
    _intern    identical jaxprs shared by many equations, interned once

May import: `_jax_compat`, `_jaxpr`, `_progress`, `errors`, `policies`, `records` and each
other; nothing of a later stage (analysis, targets, search, the session).
"""

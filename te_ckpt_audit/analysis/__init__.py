"""The second stage: what one policy keeps, recomputes and offloads, read from JAX itself.

Enters: the `Traced` of the first stage (`..trace`) and a policy spec (`..specs`). Leaves: one
`PolicyResult` per policy (`..records`): residuals with their producers and bytes, a mark per
equation, recompute FLOPs, and the findings a policy earns; on a mesh, the bytes per device.

    _apply      the traced function as JAX should differentiate it under the policy
    _analysis   JAX's own linearization under it: residuals, marks, recompute (`analyse_policy`)
    _warnings   findings for policies that silently do nothing, or change under jax_remat3
    _mesh       per-device bytes on a mesh, by XLA's partitioner or the avals' own shardings

May import: `..trace`, `_jax_compat`, `_jaxpr`, `errors`, `policies`, `records`, `registry`,
`specs` and each other; nothing of a later stage (targets, search, the session).
"""

"""The search stage: which policy (and batch) to train with, as a client of the session.

Enters: a `Session` (one trace, its cached analyses and compilers) and what to optimise: a byte
budget, the target's own verdict (`--fit`), or its throughput (`--maximize throughput`). Leaves: a
`Recommendation` (`..records`): the candidates it evaluated, the frontier, the pick and the code
to paste.

    _recommend    the byte-budget search (presets, name subsets, offload variants; each verified)
    _fit          a target's own verdict decides: the least recompute whose step fits
    _throughput   policy and batch together, each point compiled and timed (`--maximize throughput`)
    _synthesis    the policy made, not chosen (`--synthesize`): which checkpoint names to save, with
                  the batch, an exact knapsack on a per-name model fitted on compiles, each pick compiled

May import: `.._session`, `..targets`, `..trace`, `config`, `errors`, `gpus`, `tpus`, `records`,
`sizes`, `specs`, `_progress`; never a renderer.
"""

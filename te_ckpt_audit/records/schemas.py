"""Every JSON schema id te-ckpt-audit writes, in one place. A document's shape changes only with
its id."""

from __future__ import annotations

AUDIT = "te-ckpt-audit/15"  # AuditReport.to_dict(), the audit's JSON; /3: gpu, step, results[].peak;
# /4: trained, results[].audited, peak.least_fraction and backends, gpu's environment, step.own;
# mark values are identifiers (outcome saved/offloaded/recomputed/not_needed, verdict none for "-");
# /5: gpu.mesh and gpu.mesh_source, results[].requantized_equations; /6: results[].time (--time);
# /7: time.calibration (--calibrate); /8: findings (inputs-replicated), tpu and results[].tpu_plan (--tpu),
# time.examples and time.examples_per_second_per_gpu; /9: time.device, time.hardware, time.estimator
# (--tpu --time); /10: remat and remat3 (JAX's new remat, --remat3 both), finding remat3-changes-policy,
# time.floor_seconds and time.floor_kernels (what no cost model timed); /11: step.state_bytes (the optimizer
# state's bytes), step on a TPU report too, optimizer "momentum" (sgd is optax's sgd, no state),
# remat3[].changed, time.unestimated (kernels libtpu gave no estimate); /12: time.overhead_seconds (what a
# step pays beyond its kernels' work: on a TPU, a cost per step and per kernel run); /13: time.host_seconds
# and time.exposed_host_seconds (offloaded residuals' copies over the host link, and what is unhidden);
# /14: time.host_link (the bytes per second those copies were timed at; 0: the compiler's estimate);
# /15: time.dispatch_seconds (a TPU's: what the host takes to launch one step; the step takes at least it)
RECOMMEND = "te-ckpt-audit-recommend/16"  # Recommendation.to_dict(); /2: gpu, compiles, maximized, peaks;
# /3: peaks and gpu as te-ckpt-audit/4 has them; /4: as te-ckpt-audit/5 has them; /5: to_name;
# /6: candidates' time (--time), as te-ckpt-audit/6 has it; /7: throughput (--maximize throughput), and
# time as te-ckpt-audit/7 has it; /8: time as te-ckpt-audit/8 has it;
# /9: as te-ckpt-audit/9 has it; /10: time as te-ckpt-audit/10 has it; /11: time as te-ckpt-audit/11 has it;
# /12: throughput.synthesis (--synthesize: names, proposals, solver, presets) and throughput.pick (what to paste)
# /13: time as te-ckpt-audit/12 has it, throughput.synthesis.names[].line (a name the tool gave a matmul
# line, --name-lines) and throughput.pick.add (the checkpoint_name calls that give the model the pick's
# names of the tool's own), findings (what the audit says of the trace: inputs-replicated), compiles
# counts a throughput search's points; /14: time as te-ckpt-audit/13 has it; /15: as te-ckpt-audit/14 has it;
# /16: as te-ckpt-audit/15 has it
MAXTEXT_RECOMMEND = "te-ckpt-audit-maxtext-recommend/4"  # MaxTextRecommendation.to_dict(); /2: throughput;
# /3: tpu (--tpu: the slice searched, libtpu's verdict), throughput per chip; /4: tried[].custom and
# chosen.custom (remat_policy custom's tensor keys, --synthesize), throughput.synthesis
CHECK = "te-ckpt-audit-check/15"  # check results; /2: unbounded growth explicit, never a non-finite number;
# /3: each target's report is te-ckpt-audit/3, and peak figures (--gpu) may be violated; /4: reports are /4;
# /5: reports are /5; /6: reports are /6; /7: reports are /7; /8: reports are /8;
# /9: reports are /9; /10: reports are /10; /11: reports are /11; /12: reports are /12; /13: are /13; /14: are /14;
# /15: are /15
BASELINE = "te-ckpt-audit-baseline/2"  # baseline files: one entry per audit key
BASELINE_1 = "te-ckpt-audit-baseline/1"  # {target: {policy: bytes}}: still read, never written

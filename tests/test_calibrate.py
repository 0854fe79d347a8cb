"""`--calibrate PROFILE`: a ProfiledInstructionsProto measured on real GPUs (binary or text) read
strictly, and the estimate moved by exactly what it says: a kernel it names takes its measured
time, the others of its kind scale by the measured-to-estimated ratio, and the kernels it lacks are
counted. The compile that hands it to XLA's scheduler runs in tests/test_step_time.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_step_time import H100, LOOP

from te_ckpt_audit import UsageError
from te_ckpt_audit._profile import Profile, read_profile
from te_ckpt_audit.gpus import GpuRequest
from te_ckpt_audit.records import KernelKind, to_plain
from te_ckpt_audit.targets import _steptime as steptime
from te_ckpt_audit.targets._kernels import Kernel, step_kernels


def _two_gemms() -> list[Kernel]:
    """The scanned layer (a copy, a GEMM, an add; 4 trips) and a second GEMM of its own outside."""
    kernels = step_kernels(LOOP.format(layers=4))
    gemm = next(k for k in kernels if k.kind is KernelKind.GEMM)
    return [*kernels, dataclasses.replace(gemm, name="head", runs=1, loop=())]


def test_a_profile_moves_the_estimate_by_exactly_what_it_measured() -> None:
    kernels = _two_gemms()
    plain = steptime.estimate(kernels, H100, 1, 0.0)
    rows = {t.kernel.name: t for t in (steptime.timed(k, H100) for k in kernels)}
    measured_us = 250.0  # the scanned GEMM, per run
    profile = Profile("p.txt", (("mm", measured_us), ("not-in-this-step", 1.0)))
    found = steptime.estimate(kernels, H100, 1, 0.0, profile)
    # by hand: "mm" takes 250 us a run (4 runs); "head", a GEMM the profile lacks, scales by the
    # GEMMs' measured over estimated; the memory kernels, of a kind it names none of, stay
    ratio = measured_us * 1e-6 * 4 / (rows["mm"].seconds * 4)
    by_hand = (measured_us * 1e-6 * 4 + rows["head"].seconds * ratio
               + rows["w"].seconds * 4 + rows["next"].seconds * 4)
    assert found.seconds == pytest.approx(by_hand, rel=1e-12)
    assert plain.seconds is not None and found.seconds != pytest.approx(plain.seconds)
    c = found.calibration
    assert c is not None and (c.instructions, c.measured, c.missing) == (2, 1, 3)
    assert c.ratios == ((KernelKind.GEMM, pytest.approx(ratio)),) and c.estimated_seconds == plain.seconds
    assert {k.name: k.basis for k in found.costliest}["mm"] == steptime.MEASURED
    assert steptime.from_plain(to_plain(found)) == found  # the cache keeps it


def test_a_profile_that_measures_the_estimate_leaves_it_where_it_was() -> None:
    kernels = _two_gemms()
    plain = steptime.estimate(kernels, H100, 1, 0.0)
    same = Profile("p", tuple((t.kernel.name, t.seconds * 1e6) for t in (steptime.timed(k, H100) for k in kernels)))
    found = steptime.estimate(kernels, H100, 1, 0.0, same)
    assert found.seconds == pytest.approx(plain.seconds, rel=1e-12)
    assert found.calibration is not None and found.calibration.missing == 0


def test_binary_and_text_profiles_read_the_same(tmp_path: Path) -> None:
    profile = Profile(str(tmp_path / "p.pb"), (("fusion.1", 12.5), ("custom-call.3", 40.0)), (("a", "b", 3.0),))
    binary = tmp_path / "p.pb"
    binary.write_bytes(profile.serialized())
    text = tmp_path / "p.txt"
    text.write_text('costs { name: "fusion.1" cost_us: 12.5 }\n# measured on 8 H100s\n'
                    'costs { name: "custom-call.3" cost_us: 40 }\n'
                    'latencies { source: "a" target: "b" latency_us: 3 }\n')
    assert read_profile(binary) == profile
    assert dataclasses.replace(read_profile(text), source=str(binary)) == profile
    assert read_profile(text).digest == profile.digest


@pytest.mark.parametrize(("content", "said"), [
    (b"", "holds no instruction costs"),
    (b'costs { name: "x" cost_us: -1 }', "cost_us from 0 to"),
    (b'costs { name: "x" cost: 1 }', "cost"),
    (b"\xff\xfe\x00garbage", "neither a binary nor a text"),
    # issue 56, item 6: the last of two costs won; an all-zero profile made a 0 s step, exit 0
    (b'costs { name: "x" cost_us: 1 } costs { name: "x" cost_us: 2 }', "gives 'x' two costs"),
    (b'costs { name: "x" cost_us: 0 } costs { name: "y" cost_us: 0 }', "every cost is 0 us"),
])
def test_a_bad_profile_is_a_usage_error(tmp_path: Path, content: bytes, said: str) -> None:
    path = tmp_path / "p"
    path.write_bytes(content)
    with pytest.raises(UsageError, match=said):
        read_profile(path)
    with pytest.raises(UsageError, match="no such profile"):
        read_profile(tmp_path / "nosuch")


def test_calibrate_needs_the_time_estimate() -> None:
    with pytest.raises(UsageError, match="calibrate"):
        GpuRequest(H100, profile=Profile("p", (("x", 1.0),)))


def test_a_large_profile_is_read_in_one_pass_and_its_error_line_is_right(tmp_path: Path) -> None:
    """Issue 46, item 11: each token counted the newlines from the file's start (1 MiB: 69 s)."""
    from te_ckpt_audit import _textproto

    text = "x\n" * 2**19  # 1 MiB, 524288 lines
    tokens = _textproto._tokens(text, "p.txt")
    assert len(tokens) == 2**19 and tokens[-1] == ("id", "x", 2**19)
    bad = tmp_path / "j.txt"
    bad.write_text(text + "@\n")
    with pytest.raises(UsageError, match=f"line {2**19 + 1}: '@"):
        read_profile(bad)


@pytest.mark.parametrize("escape", ["\\8", "\\9"])
def test_a_non_octal_digit_escape_is_a_usage_error_not_an_internal_one(escape: str) -> None:
    from te_ckpt_audit import _textproto

    with pytest.raises(UsageError, match=r"unknown escape"):
        _textproto._unquote(f'"a{escape}b"')
    assert _textproto._unquote('"\\101\\7"') == "A\a"


def test_a_profile_calibrates_a_gpu_without_xlas_cost_tables_too() -> None:
    """Issue 56, item 6: `--gpu a100 --time --calibrate p.txt` ignored the profile: a GPU XLA has no
    cost tables for is timed at the roofline, and the measured costs win over it as over the tables."""
    kernels = _two_gemms()
    measured_us = 250.0
    profile = Profile("p.txt", (("mm", measured_us),))
    plain = steptime.estimate(kernels, H100, 1, 0.0, no_table="sm_80")
    found = steptime.estimate(kernels, H100, 1, 0.0, profile, no_table="sm_80")
    assert found.calibration is not None and found.calibration.measured == 1
    assert found.calibration.estimated_seconds == plain.seconds and found.seconds != plain.seconds
    assert {k.name: k.basis for k in found.costliest}["mm"] == steptime.MEASURED
    assert found.estimator == plain.estimator == steptime.ROOFLINE_ESTIMATOR


def test_an_escape_error_in_a_profile_names_the_file(tmp_path: Path) -> None:
    """Issue 56, item 6: "unknown escape \\q in a string" did not say in which file."""
    path = tmp_path / "p.txt"
    path.write_text('costs { name: "a\\q" cost_us: 1 }\n')
    with pytest.raises(UsageError) as err:
        read_profile(path)
    assert err.value.message.startswith(f"the profile {path}: unknown escape \\q")

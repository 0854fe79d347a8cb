"""The kernels of a step XLA:GPU or libtpu compiled, read from its optimized HLO text: what the
step-time estimate (`_steptime`) costs.

Each instruction of the entry computation (and of the loops, calls and branches it runs) that
launches work is one kernel, run as many times as the loops around it turn (`known_trip_count`;
libtpu gives none: the constant the loop's condition compares with):
a fusion (its FLOPs those of the dots, libtpu's convolutions and the elementwise ops inside it,
its bytes its operands and results, except where it, or a fusion nested in it, updates or reads a
slice of a buffer in place: then the slice's; on a TPU, nothing of what libtpu keeps in VMEM); a
cuBLAS or TE GEMM; fused attention (cuDNN's, TE's); a copy between host and device; a collective.
Instructions that launch nothing (parameters, tuples, bitcasts, constants) are left out. Each
kernel carries XLA's own estimate where the compile collected it (`reification_cost`, compile
option `xla_gpu_collect_cost_model_stats`; libtpu's `estimated_cycles`, which every TPU compile
writes) and the source it came from (its `op_name` metadata).
The module is the partitioned one: its shapes are one device's.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import re
from collections.abc import Callable, Iterator

import numpy as np

from ..records import KernelKind

_BITS = {
    "pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "f4e2m1fn": 4, "s8": 8, "u8": 8, "bf16": 16, "f16": 16, "s16": 16,
    "u16": 16, "f32": 32, "s32": 32, "u32": 32, "f64": 64, "s64": 64, "u64": 64, "c64": 64, "c128": 128, "token": 0,
}
_SHAPE = re.compile(r"\b([a-z]\w*)\[([\d,]*)\]")
_LEAF = re.compile(r"\b([a-z]\w*)\[([\d,]*)\](\{[^}]*\})?")  # with its layout
_NO_KERNEL = frozenset({
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id", "replica-id",
    "opt-barrier", "add-dependency", "domain", "send", "recv", "send-done", "recv-done", "copy-done", "fusion-done",
    "async-update", "call", "while", "conditional", "reshape", "get-dimension-size", "infeed", "outfeed",
})
_COLLECTIVES = {
    "all-reduce": "all-reduce", "all-gather": "all-gather", "reduce-scatter": "reduce-scatter",
    "all-to-all": "all-to-all", "ragged-all-to-all": "all-to-all", "collective-permute": "collective-permute",
    "collective-broadcast": "all-gather",
}
_ELEMENTWISE = frozenset({
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "exponential", "exponential-minus-one", "log",
    "log-plus-one", "tanh", "logistic", "rsqrt", "sqrt", "cbrt", "power", "negate", "abs", "compare", "select",
    "and", "or", "xor", "not", "sine", "cosine", "tan", "atan2", "erf", "floor", "ceil", "round-nearest-even",
    "clamp", "remainder", "sign", "is-finite",
})
_DMAS = frozenset({"copy-start", "slice-start", "dynamic-slice-start", "dynamic-update-slice-start"})
_GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul")
_VIEWS = ("bitcast", "copy", "transpose", "get-tuple-element")  # what a GEMM's operand is read through


def _bits(dtype: str) -> int:
    if dtype.startswith("f8"):
        return 8
    return _BITS.get(dtype, 32)


def _leaves(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
    return [(d, tuple(int(x) for x in dims.split(",") if x)) for d, dims in _SHAPE.findall(type_text)]


def type_bytes(type_text: str, on_chip: str = "") -> int:
    """The bytes of an HLO type (a tuple's, all its leaves); with `on_chip` (a memory space's mark
    in a layout: libtpu's VMEM), those the leaves in that memory leave out: what crosses HBM.

    >>> type_bytes("(bf16[8,128]{1,0}, s8[4]{0})"), type_bytes("(bf16[8,128]{1,0:T(8,128)(2,1)S(1)}, f32[4]{0})", VMEM)
    (2052, 16)
    """
    return sum(math.prod(int(x) for x in dims.split(",") if x) * _bits(d) // 8
               for d, dims, layout in _LEAF.findall(type_text) if not on_chip or on_chip not in layout)


VMEM = "S(1)"  # libtpu's layouts: the TensorCore's vector memory, beside the HBM
HOST_MEMORY = "S(5)"  # XLA's layouts: host memory (an offloaded residual's buffer)
_HOST_MOVES = ("fusion", "dynamic-slice", "dynamic-update-slice", "copy")  # what moves data to or from it


@dataclasses.dataclass(slots=True)
class Inst:
    name: str
    type: str
    opcode: str
    operands: list[str]
    attrs: str

    def attr(self, key: str) -> str | None:
        m = re.search(rf"\b{key}=(%?[\w.\-]+)", self.attrs)
        return m.group(1).lstrip("%") if m else None

    def backend_config(self) -> dict[str, object]:
        m = re.search(r"backend_config=(\{.*\})\s*$", self.attrs) or re.search(r"backend_config=(\{.*\})", self.attrs)
        if not m:
            return {}
        text = m.group(1)
        depth = 0
        for i, ch in enumerate(text):  # the JSON object alone, whatever follows it
            depth += ch == "{"
            depth -= ch == "}"
            if depth == 0:
                try:
                    value = json.loads(text[:i + 1])
                except ValueError:
                    return {}
                return value if isinstance(value, dict) else {}
        return {}


def _balanced(text: str, start: int) -> int:
    """The index just past the bracket group opening at `start`."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = []
    i = start
    while i < len(text):
        ch = text[i]
        if ch in pairs:
            stack.append(pairs[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
            if not stack:
                return i + 1
        elif ch == '"':
            i = text.index('"', i + 1) if '"' in text[i + 1:] else len(text)
        i += 1
    return len(text)


def _split_top(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        parts.append("".join(cur))
    return parts


_LINE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")


def _instruction(line: str) -> Inst | None:
    m = _LINE.match(line)
    if not m:
        return None
    rest = line[m.end():]
    if rest.startswith("("):
        end = _balanced(rest, 0)
        type_text, rest = rest[:end], rest[end:].lstrip()
    else:
        type_text, _, rest = rest.partition(" ")
    op = re.match(r"([\w\-]+)\(", rest)
    if not op:
        return None
    end = _balanced(rest, op.end() - 1)
    inside = rest[op.end():end - 1]
    if op.group(1) in ("parameter", "constant"):  # its number (the fusion's operands are in its order), its value
        return Inst(m.group(1), type_text, op.group(1), [inside.strip()], rest[end:])
    operands = []
    for part in _split_top(inside):
        names = re.findall(r"%([\w.\-]+)", part)
        operands.append(names[-1] if names else "")
    return Inst(m.group(1), type_text, op.group(1), operands, rest[end:])


def parse_module(text: str) -> tuple[dict[str, list[Inst]], str]:
    """The computations of an HLO module (name -> instructions, in order) and the entry's name."""
    comps: dict[str, list[Inst]] = {}
    entry = ""
    current: list[Inst] | None = None
    for line in text.splitlines():
        if current is None:
            h = _HEADER.match(line)
            if h and not line.startswith("HloModule"):
                current = comps.setdefault(h.group(2), [])
                if h.group(1):
                    entry = h.group(2)
            continue
        if line.strip() == "}":
            current = None
            continue
        inst = _instruction(line)
        if inst is not None:
            current.append(inst)
    return comps, entry


# --- collectives' groups -----------------------------------------------------------------------


def _groups(inst: Inst, devices: int) -> list[list[int]]:
    """The device groups of a collective, from its `replica_groups` (every format XLA prints) or
    a permute's `source_target_pairs`."""
    attrs = inst.attrs
    pairs = re.search(r"source_target_pairs=\{(.*?)\}\}", attrs)
    if pairs:
        return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)", pairs.group(1) + "}")]
    m = re.search(r"replica_groups=", attrs)
    if not m:
        return [list(range(devices))]
    rest = attrs[m.end():]
    mesh = re.match(r"mesh\[([^\]]*)\]\s*\{([^}]*)\}", rest)
    if mesh:
        axes = [(a, int(n)) for a, n in re.findall(r"'([^']+)'=(\d+)", mesh.group(1))]
        chosen = set(re.findall(r"'([^']+)'", mesh.group(2)))
        sizes = [n for _, n in axes]
        ids = np.arange(math.prod(sizes)).reshape(sizes)
        inner = [i for i, (a, _) in enumerate(axes) if a in chosen]
        outer = [i for i, (a, _) in enumerate(axes) if a not in chosen]
        size = math.prod(sizes[i] for i in inner)
        return ids.transpose(outer + inner).reshape(-1, size).tolist()
    iota = re.match(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", rest)
    if iota:
        shape = [int(x) for x in iota.group(1).split(",")]
        dims = [int(x) for x in iota.group(2).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if iota.group(3):
            ids = ids.transpose([int(x) for x in iota.group(3).split(",")])
        return ids.reshape(shape[0], -1).tolist()
    listed = re.match(r"\{(.*?)\}(?=,|\s|$)", rest + " ")
    text = rest[:_balanced(rest, 0)] if rest.startswith("{") else ""
    found = [[int(x) for x in g.split(",") if x.strip()] for g in re.findall(r"\{([\d,\s]*)\}", text[1:-1])]
    if listed is not None and found:
        return found
    return [list(range(devices))]


def _group(groups: list[list[int]], per_host: int) -> tuple[int, bool, int]:
    """The devices a collective's largest group spans, whether any group spans hosts, and the
    fewest of a spanning group's devices on one host (each host's share of the network traffic
    leaves through that many NICs)."""
    size = max((len(g) for g in groups), default=1)
    spanning = [g for g in groups if len({d // per_host for d in g}) > 1]
    local = min((min(collections.Counter(d // per_host for d in g).values()) for g in spanning), default=1)
    return size, bool(spanning), local


# --- instructions to kernels -------------------------------------------------------------------

GEMM, ATTENTION, MEMORY, COLLECTIVE, HOST = (KernelKind.GEMM, KernelKind.ATTENTION, KernelKind.MEMORY,
                                             KernelKind.COLLECTIVE, KernelKind.HOST)


@dataclasses.dataclass(frozen=True, slots=True)
class Kernel:
    """One kernel of a compiled step, as the estimate costs it: per device, per run."""

    name: str  # the HLO instruction
    kind: KernelKind
    flops: int
    bytes: int  # what it reads and writes in HBM (a collective: its operand; an all-gather: its result)
    precision: str = "bf16"  # a GEMM's operands: fp8, bf16, tf32, fp64
    widening: int = 1  # a GEMM's result bytes over its operands' (2: bf16 x bf16 -> f32)
    xla_us: tuple[tuple[str, float], ...] = ()  # XLA's estimates (model name, microseconds)
    runs: int = 1  # times one step runs it (the trip counts of the loops around it)
    group: int = 1  # a collective's devices
    spans_hosts: bool = False  # a collective's group crosses hosts
    nics: int = 1  # across hosts: the group's devices on each host (their NICs share the traffic)
    source: str = ""  # what it computes: the op_name of its metadata, and its source line
    collective: str = ""  # a collective's kind: all-reduce, all-gather, reduce-scatter, all-to-all, ...
    asynchronous: bool = False  # a collective or host copy that starts here, waited for later (its `waits_for`)
    waits_for: str = ""  # not a kernel: where the schedule waits for the asynchronous collective named
    loop: tuple[str, ...] = ()  # the while loops around it, outermost first (the schedule's order is theirs)
    cycles: int = 0  # libtpu's estimate of one run, in the chip's cycles (`estimated_cycles`; 0 elsewhere)
    vmem_copy: bool = False  # a TPU's DMA between HBM and VMEM (libtpu gives it no cycles): `bytes` what it moves
    vmem_bytes: int = 0  # on a TPU: what it reads and writes in VMEM (`bytes` is HBM's)
    indices: int = 0  # a gather's or scatter's index vectors: the rows it reads or writes one by one
    window_taps: int = 0  # a reduce-window's (output, window tap) pairs that read its input: its work
    window_sublane: bool = False  # libtpu runs that window down the tile's sublanes, not along its lanes


class _Reader:
    def __init__(self, comps: dict[str, list[Inst]], devices: int, per_host: int, on_chip: str = "") -> None:
        self.comps, self.devices, self.per_host, self.on_chip = comps, devices, per_host, on_chip
        self.host_copies: set[str] = set()  # the copy-starts to or from host memory read so far
        self.dmas: set[str] = set()  # the copy- and slice-starts between a TPU's HBM and VMEM read so far
        self.types = {name: {i.name: i.type for i in insts} for name, insts in comps.items()}
        self._fused: dict[str, tuple[int, bool, str, int]] = {}
        self._insts: dict[str, dict[str, Inst]] = {}
        self._holds_fp8: dict[str, bool] = {}
        self._use_maps: dict[str, tuple[dict[int, str], dict[str, list[tuple[Inst, int]]]]] = {}

    def quantized(self, comp: str, names: list[str]) -> bool:
        """Whether an operand of a GEMM (`names`) comes out of a quantize-dequantize: a fusion
        (through bitcasts, copies, transposes, and a multi-output fusion's get-tuple-element: the
        backward pass's quantize also takes the amax) whose body holds an 8-bit float. MaxText's and Flax's
        FP8 dot generals are such GEMMs; XLA's GEMM rewriter makes them cuBLASLt FP8 GEMMs where it
        knows the GPU's cuBLAS (on the GPU), and leaves them BF16 GEMMs in a compile without one."""
        insts = self._insts.setdefault(comp, {i.name: i for i in self.comps.get(comp, [])})
        for name in names:
            inst = insts.get(name)
            for _ in range(4):
                if inst is None or inst.opcode not in _VIEWS or not inst.operands:
                    break
                inst = insts.get(inst.operands[0])
            if inst is not None and inst.opcode == "fusion" and self._fp8_inside(inst.attr("calls") or ""):
                return True
        return False

    def _fp8_inside(self, comp: str) -> bool:
        if comp not in self._holds_fp8:
            self._holds_fp8[comp] = False  # a cycle cannot hold one
            self._holds_fp8[comp] = any(
                i.type.startswith("f8") or (i.opcode == "fusion" and self._fp8_inside(i.attr("calls") or ""))
                for i in self.comps.get(comp, []))
        return self._holds_fp8[comp]

    def operand_type(self, comp: str, name: str) -> str:
        return self.types[comp].get(name, "")

    def fused(self, name: str) -> tuple[int, bool, str, int]:
        """(FLOPs, holds a GEMM, the GEMM's precision, its widening) of a fused computation, nested
        ones included."""
        if name in self._fused:
            return self._fused[name]
        flops, gemm, precision, widening = 0, False, "bf16", 1
        for inst in self.comps.get(name, []):
            if inst.opcode in ("dot", "scaled-dot"):
                lhs = self.operand_type(name, inst.operands[0])
                flops += _dot_flops(inst, lhs)
                gemm, precision = True, "fp8" if inst.opcode == "scaled-dot" else _precision(lhs)
                widening = _widening(lhs, inst.type)
            elif inst.opcode == "convolution":  # libtpu's GEMMs
                lhs, rhs = (self.operand_type(name, o) for o in (*inst.operands, "", "")[:2])
                flops += _conv_flops(inst, lhs, rhs)
                gemm, precision, widening = True, _precision(lhs), _widening(lhs, inst.type)
            elif inst.opcode == "fusion" and inst.attr("calls"):
                f, g, p, w = self.fused(inst.attr("calls") or "")
                flops += f
                if g:
                    gemm, precision, widening = True, p, w
            elif inst.opcode in _ELEMENTWISE:
                flops += math.prod(_first_dims(inst.type))
            elif inst.opcode == "reduce":
                flops += math.prod(_first_dims(self.operand_type(name, inst.operands[0])))
        self._fused[name] = (flops, gemm, precision, widening)
        return self._fused[name]

    def indexed(self, name: str) -> int:
        """The index vectors of the gathers and scatters of a fused computation, nested ones included."""
        return self._nested(name, lambda comp, inst: self.index_vectors(comp, inst)
                            if inst.opcode in ("gather", "scatter") else 0)

    def windowed(self, name: str) -> int:
        """The window taps of the reduce-windows of a fused computation, nested ones included."""
        return self._nested(name, lambda comp, inst: window_taps(inst, self.operand_type(comp, inst.operands[0]))
                            if inst.opcode == "reduce-window" else 0)

    def _nested(self, name: str, each: Callable[[str, Inst], int], depth: int = 0) -> int:
        """`each` summed over a fused computation's instructions, the fusions nested in it (4 deep) included."""
        total = 0
        for inst in self.comps.get(name, []):
            if inst.opcode == "fusion" and inst.attr("calls") and depth < 4:
                total += self._nested(inst.attr("calls") or "", each, depth + 1)
            else:
                total += each(name, inst)
        return total

    def index_vectors(self, comp: str, inst: Inst) -> int:
        """A gather's or scatter's index vectors: its indices' elements over the index vector's length."""
        dims = _first_dims(self.operand_type(comp, inst.operands[1])) if len(inst.operands) > 1 else []
        found = re.search(r"index_vector_dim=(\d+)", inst.attrs)
        axis = int(found.group(1)) if found else len(dims)
        return math.prod(dims) // (dims[axis] or 1) if axis < len(dims) else math.prod(dims)

    def hbm(self, type_text: str) -> int:
        return type_bytes(type_text, self.on_chip)

    def fusion_bytes(self, comp: str, inst: Inst) -> int:
        """What a fusion reads and writes: each operand once, but only the slice a parameter is
        read at (dynamic-slice, here or in a fusion nested in it: a loop's layer of a stacked
        buffer) and nothing of a buffer updated in place (dynamic-update-slice), whose result is
        then only the update."""
        called = inst.attr("calls") or ""
        total = 0
        for pos, operand in enumerate(inst.operands):
            read = self._read(called, pos, self.hbm(self.operand_type(comp, operand)))
            total += read or 0  # None: updated in place
        body = self.comps.get(called, [])
        out = self.hbm(inst.type)
        if body:
            out = self._written(called, body[-1], out)
        return total + out

    def _uses(self, comp: str) -> tuple[dict[int, str], dict[str, list[tuple[Inst, int]]]]:
        """A computation's parameters by number, and what reads each instruction (through bitcasts)."""
        if comp not in self._use_maps:
            body = self.comps.get(comp, [])
            params = {int(m.group(1)): i.name for i in body if i.opcode == "parameter"
                      and (m := re.match(r"(\d+)", i.operands[0] if i.operands and i.operands[0] else "")) is not None}
            if not params:
                params = dict(enumerate(i.name for i in body if i.opcode == "parameter"))
            direct: dict[str, list[tuple[Inst, int]]] = {}
            for i in body:
                for pos, o in enumerate(i.operands):
                    direct.setdefault(o, []).append((i, pos))

            def uses_of(name: str, depth: int = 0) -> list[tuple[Inst, int]]:
                out: list[tuple[Inst, int]] = []
                for u, pos in direct.get(name, []):
                    if u.opcode == "bitcast" and depth < 8:
                        out += uses_of(u.name, depth + 1)
                    else:
                        out.append((u, pos))
                return out

            self._use_maps[comp] = params, {name: uses_of(name) for name in params.values()}
        return self._use_maps[comp]

    def _read(self, comp: str, pos: int, full: int, depth: int = 0) -> int | None:
        """The bytes a fused computation reads of its parameter `pos` (`full` bytes), None where
        it only updates it in place."""
        params, users = self._uses(comp)
        uses = users.get(params.get(pos, ""), [])
        if not uses:
            return full
        if all(u.opcode == "dynamic-update-slice" and p == 0 for u, p in uses):
            return None
        total = 0
        for u, p in uses:
            if u.opcode in ("dynamic-slice", "slice", "gather") and p == 0:
                total += self.hbm(u.type)
            elif u.opcode == "fusion" and u.attr("calls") and depth < 4:
                inner = self._read(u.attr("calls") or "", p, full, depth + 1)
                if inner is None:
                    return None if len(uses) == 1 else full
                total += inner
            else:
                return full
        return min(full, total)

    def _written(self, comp: str, root: Inst, whole: int) -> int:
        types = self.types.get(comp, {})
        if root.opcode == "dynamic-update-slice":
            return self.hbm(types.get(root.operands[1], "")) if len(root.operands) > 1 else whole
        if root.opcode == "tuple":
            body = {i.name: i for i in self.comps.get(comp, [])}
            return sum(self._written(comp, body[o], self.hbm(types.get(o, ""))) if o in body
                       else self.hbm(types.get(o, "")) for o in root.operands)
        if root.opcode == "bitcast" and root.operands:
            body = {i.name: i for i in self.comps.get(comp, [])}
            if root.operands[0] in body:
                return self._written(comp, body[root.operands[0]], whole)
        return whole

    def kernels(self, comp: str, runs: int = 1, loop: tuple[str, ...] = ()) -> Iterator[Kernel]:
        """The kernels of `comp` in the order XLA scheduled them (its text's), each run `runs` times."""
        for inst in self.comps.get(comp, []):
            for k in self.kernel(comp, inst, runs, loop):
                yield k if k.loop else dataclasses.replace(k, loop=loop)

    def kernel(self, comp: str, inst: Inst, runs: int, loop: tuple[str, ...] = ()) -> Iterator[Kernel]:
        code = inst.opcode
        if code == "while":
            body = inst.attr("body")
            if body:
                yield from self.kernels(body, runs * self.trip_count(inst), (*loop, inst.name))
            return
        if code == "call":
            target = inst.attr("to_apply") or inst.attr("calls")
            if target:
                yield from self.kernels(target, runs, loop)
            return
        if code == "conditional":
            listed = re.search(r"branch_computations=\{([^}]*)\}", inst.attrs)
            names = re.findall(r"%?([\w.\-]+)", listed.group(1)) if listed else [
                n for n in (inst.attr("true_computation"), inst.attr("false_computation")) if n]
            branches = [list(self.kernels(n, runs, loop)) for n in names]
            if branches:  # the heaviest branch
                yield from max(branches, key=lambda ks: sum(k.flops + k.bytes for k in ks))
            return
        if code == "async-start":
            called = inst.attr("calls") or ""
            wrapped = self.comps.get(called, [])
            if wrapped:
                yield from (dataclasses.replace(k, name=inst.name, asynchronous=k.kind is COLLECTIVE)
                            for k in self.kernel(called, wrapped[-1], runs, loop))
            return
        if code == "async-done" or (code.endswith("-done") and code.removesuffix("-done") in _COLLECTIVES):
            if inst.operands and inst.operands[0]:
                yield Kernel(inst.name, COLLECTIVE, 0, 0, runs=runs, waits_for=inst.operands[0])
            return
        if code.endswith("-done") and inst.operands and inst.operands[0] in self.host_copies:
            yield Kernel(inst.name, HOST, 0, 0, runs=runs, waits_for=inst.operands[0])  # where the step waits for it
            return
        if code.endswith("-done") and inst.operands and inst.operands[0] in self.dmas:
            yield Kernel(inst.name, MEMORY, 0, 0, runs=runs, waits_for=inst.operands[0], vmem_copy=True)
            return
        for k in self._kernel(comp, inst, runs):
            yield dataclasses.replace(k, cycles=_cycles(inst)) if k.kind is not COLLECTIVE else k

    def trip_count(self, inst: Inst) -> int:
        """A while loop's trips: XLA:GPU's `known_trip_count`, else (libtpu gives none) the largest
        integer its condition compares with (a scan's `i < N`), else 1."""
        known = _trip_count(inst)
        if known > 1 or "known_trip_count" in inst.attrs:
            return known
        cond = inst.attr("condition") or ""
        found = [int(m.group(1)) for i in self._called(cond) if i.opcode == "constant"
                 and (m := re.fullmatch(r"(-?\d+)", i.operands[0].strip() if i.operands else "")) is not None]
        return max([1, *found])

    def _called(self, comp: str, depth: int = 0) -> list[Inst]:
        """The instructions of `comp` and of the computations its fusions call."""
        out = list(self.comps.get(comp, []))
        if depth < 4:
            for i in self.comps.get(comp, []):
                if i.opcode == "fusion" and i.attr("calls"):
                    out += self._called(i.attr("calls") or "", depth + 1)
        return out

    def _kernel(self, comp: str, inst: Inst, runs: int) -> Iterator[Kernel]:
        code = inst.opcode
        base = code.removesuffix("-start")
        costs = _xla_costs(inst)
        source = _source(inst)
        if base in _COLLECTIVES:
            size, spans, local = _group(_groups(inst, self.devices), self.per_host)
            moved = sum(type_bytes(self.operand_type(comp, o)) for o in inst.operands)
            if _COLLECTIVES[base] == "all-gather":
                moved *= size
            yield Kernel(inst.name, COLLECTIVE, 0, moved, xla_us=costs, runs=runs, group=size, spans_hosts=spans,
                         source=source, collective=_COLLECTIVES[base], asynchronous=code.endswith("-start"),
                         nics=local)
            return
        if code in _DMAS and self.on_chip and self.on_chip in inst.type and HOST_MEMORY not in inst.type:
            # between HBM and VMEM (a parameter brought in before a kernel reads it, a slice of one, a
            # result written back): the chip's DMA engines move what lands in or leaves VMEM, beside
            # the kernels scheduled until its -done
            self.dmas.add(inst.name)
            moved = type_bytes(inst.type) - self.hbm(inst.type)
            yield Kernel(inst.name, MEMORY, 0, moved, xla_us=costs, runs=runs, source=source, asynchronous=True,
                         vmem_copy=True)
            return
        if code == "copy-start":
            operand = self.operand_type(comp, inst.operands[0]) if inst.operands else ""
            host = HOST_MEMORY in inst.type or HOST_MEMORY in operand
            if host:  # one side is host memory: on the copy engine, beside the kernels until its copy-done
                self.host_copies.add(inst.name)
            yield Kernel(inst.name, HOST if host else MEMORY, 0, type_bytes(operand) * (1 if host else 2),
                         xla_us=costs, runs=runs, source=source, asynchronous=host)
            return
        if code in _NO_KERNEL or code.endswith("-done"):
            return
        if base in _HOST_MOVES and (HOST_MEMORY in inst.type or any(
                HOST_MEMORY in self.operand_type(comp, o) for o in inst.operands)):
            # an offloaded residual's slice written to or read from host memory (a scanned stack's:
            # XLA:GPU's dynamic-update-slice and dynamic-slice fusions, libtpu's dynamic-update-slice-
            # and dynamic-slice-starts): what crosses the host link is its device side; a -start's
            # type holds its operands and result both
            started = code.endswith("-start")
            moved = type_bytes(inst.type, HOST_MEMORY) + (0 if started else sum(
                type_bytes(self.operand_type(comp, o), HOST_MEMORY) for o in inst.operands))
            if started:
                self.host_copies.add(inst.name)
            yield Kernel(inst.name, HOST, 0, moved, xla_us=costs, runs=runs, source=source, asynchronous=started)
            return
        if code in ("fusion", "fusion-start"):
            called = inst.attr("calls") or ""
            inner = [i for i in self.comps.get(called, []) if i.opcode == "custom-call" and _is_gemm(i)]
            if inner:  # a cuBLAS GEMM inside (a dynamic-slice fusion): XLA costs it there, not on the fusion
                gemm_kernel = self._custom_call(called, inner[0])
                yield dataclasses.replace(gemm_kernel, name=inst.name, bytes=self.fusion_bytes(comp, inst),
                                          xla_us=_xla_costs(inner[0]), runs=runs, source=_source(inner[0]) or source)
                return
            flops, gemm, precision, widening = self.fused(called)
            taps = self.windowed(called)
            yield Kernel(inst.name, GEMM if gemm else MEMORY, flops, self.fusion_bytes(comp, inst), precision,
                         widening, costs, runs, source=source, indices=self.indexed(called),
                         window_taps=taps, window_sublane=bool(taps) and _sublane(inst))
            return
        if code == "custom-call":
            if self.on_chip and 'custom_call_target="ConcatBitcast"' in inst.attrs:
                return  # libtpu's view of slices DMA'd side by side into one buffer: launches nothing
            yield dataclasses.replace(self._custom_call(comp, inst), xla_us=costs, runs=runs, source=source)
            return
        ins = [self.operand_type(comp, o) for o in inst.operands]
        moved = sum(map(self.hbm, ins)) + self.hbm(inst.type)
        if code == "dot":
            yield Kernel(inst.name, GEMM, _dot_flops(inst, ins[0]), moved, _precision(ins[0]),
                         _widening(ins[0], inst.type), costs, runs, source=source)
            return
        if code == "dynamic-update-slice" and len(ins) > 1:
            moved = 2 * self.hbm(ins[1])
        elif code in ("dynamic-slice", "slice", "gather"):
            moved = 2 * self.hbm(inst.type)
        flops = math.prod(_first_dims(inst.type)) if code in _ELEMENTWISE else 0
        yield Kernel(inst.name, MEMORY, flops, moved, xla_us=costs, runs=runs, source=source,
                     indices=self.index_vectors(comp, inst) if code in ("gather", "scatter") else 0,
                     window_taps=window_taps(inst, ins[0]) if code == "reduce-window" and ins else 0,
                     window_sublane=code == "reduce-window" and _sublane(inst))

    def _custom_call(self, comp: str, inst: Inst) -> Kernel:
        found = re.search(r'custom_call_target="([^"]*)"', inst.attrs)
        target = found.group(1) if found else ""
        ins = [self.operand_type(comp, o) for o in inst.operands]
        outs = _leaves(inst.type)
        moved = sum(map(type_bytes, ins)) + type_bytes(inst.type)
        low = target.lower()
        if target.startswith(_GEMM_TARGETS):
            lhs = ins[0] if ins else ""
            config = inst.backend_config().get("gemm_backend_config", {})
            dims = config.get("dot_dimension_numbers", {}) if isinstance(config, dict) else {}
            contract = [int(d) for d in dims.get("lhs_contracting_dimensions", [])] if isinstance(dims, dict) else []
            lhs_dims = _first_dims(lhs)
            k = (math.prod(lhs_dims[d] for d in contract if d < len(lhs_dims)) if contract
                 else (lhs_dims[-1] if lhs_dims else 1))
            result = math.prod(outs[0][1]) if outs else 0
            workspace = type_bytes(inst.type) - (math.prod(outs[0][1]) * _bits(outs[0][0]) // 8 if outs else 0)
            # an FP8 GEMM multiplies two FP8 operands (cuBLASLt takes no other): one quantized operand
            # beside a BF16 one stays a BF16 GEMM on the GPU, as in the compile without one
            fp8 = target.endswith("f8") or lhs.startswith("f8") or (
                len(inst.operands) >= 2 and all(self.quantized(comp, [o]) for o in inst.operands[:2]))
            precision = "fp8" if fp8 else _precision(lhs)
            out_type = f"{outs[0][0]}[]" if outs else ""
            return Kernel(inst.name, GEMM, 2 * result * k, moved - workspace, precision, _widening(lhs, out_type))
        if "fmha" in low or "fused_attn" in low or "flash" in low:
            return Kernel(inst.name, ATTENTION, _attention_flops(ins, low, inst.attrs.lower()), moved,
                          _precision(ins[0] if ins else ""))
        if "gemm" in low or "matmul" in low:  # TE's GEMMs: the two largest operands are its matrices
            big = sorted((math.prod(d) for _, d in (_leaves(t)[0] for t in ins if _leaves(t))), reverse=True)[:2]
            out = max((math.prod(d) for _, d in outs), default=0)
            flops = int(2 * math.sqrt(big[0] * big[1] * out)) if len(big) == 2 else 0
            precision = "fp8" if any(t.startswith("f8") for t in ins) else _precision(ins[0] if ins else "")
            return Kernel(inst.name, GEMM, flops, moved, precision)
        return Kernel(inst.name, MEMORY, 0, moved)


def _is_gemm(inst: Inst) -> bool:
    found = re.search(r'custom_call_target="([^"]*)"', inst.attrs)
    return found is not None and found.group(1).startswith(_GEMM_TARGETS)


def _widening(lhs: str, out: str) -> int:
    """A GEMM's result element bytes over its operands' (bf16 x bf16 -> f32: 2)."""
    a, b = _leaves(lhs), _leaves(out)
    if not a or not b:
        return 1
    return max(1, _bits(b[0][0]) // max(1, _bits(a[0][0])))


def _xla_costs(inst: Inst) -> tuple[tuple[str, float], ...]:
    """XLA's estimates of a kernel (`reification_cost`: one per cost model), microseconds."""
    found = inst.backend_config().get("reification_cost")
    if not isinstance(found, list):
        return ()
    out = []
    for entry in found:
        if isinstance(entry, dict) and isinstance(entry.get("exec_time_us"), int | float):
            out.append((str(entry.get("name", "")) or "gpu-performance-model", float(entry["exec_time_us"])))
    return tuple(out)


_OP_NAME = re.compile(r'op_name="([^"]*)"')
_SOURCE_FILE = re.compile(r'source_file="([^"]*)" source_line=(\d+)')


def _source(inst: Inst) -> str:
    name = _OP_NAME.search(inst.attrs)
    where = _SOURCE_FILE.search(inst.attrs)
    text = name.group(1) if name else ""
    if where:
        text += f" ({where.group(1).rsplit('/', 1)[-1]}:{where.group(2)})"
    return text



def _first_dims(type_text: str) -> tuple[int, ...]:
    leaves = _leaves(type_text)
    return leaves[0][1] if leaves else ()


def _precision(type_text: str) -> str:
    dtype = _leaves(type_text)[0][0] if _leaves(type_text) else "bf16"
    if dtype.startswith("f8") or dtype in ("s8", "u8"):
        return "fp8"
    if dtype in ("bf16", "f16"):
        return "bf16"
    if dtype == "f64":
        return "fp64"
    return "tf32" if dtype == "f32" else "bf16"


def _dot_flops(inst: Inst, lhs: str) -> int:
    m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", inst.attrs)
    dims = _first_dims(lhs)
    contract = [int(x) for x in m.group(1).split(",") if x] if m else []
    k = math.prod(dims[d] for d in contract if d < len(dims)) if contract else 1
    return 2 * math.prod(_first_dims(inst.type)) * k


def _conv_flops(inst: Inst, lhs_type: str = "", rhs_type: str = "") -> int:
    """A convolution's multiply-adds, x 2: each output element sums its input features over the
    window taps that land on the input, padding left out (libtpu writes a dot as a convolution, a
    weight gradient's contraction as its window, a per-head contraction as a window padded on both
    sides, where all but one tap of each output falls in the padding).

    >>> conv = '%c = bf16[2048,32000,1]{1,0,2} convolution(%a, %b), window={size=4}, dim_labels=0fb_0io->bf0'
    >>> _conv_flops(_instruction(conv), "bf16[4,1024,2048]", "bf16[4,1024,32000]") == 2 * 2048 * 32000 * 4 * 1024
    True
    """
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", inst.attrs)
    lhs, rhs, out = _first_dims(lhs_type), _first_dims(rhs_type), _first_dims(inst.type)
    if not labels or [len(x) for x in labels.groups()] != [len(lhs), len(rhs), len(out)]:
        return 2 * math.prod(out)
    lhs_labels, rhs_labels, out_labels = labels.groups()
    features = rhs[rhs_labels.index("i")] if "i" in rhs_labels else 1
    taps = 1
    window = _window(inst.attrs)
    for d, label in enumerate(rhs_labels):
        if not label.isdigit():
            continue
        size, (lo, _), stride, lhs_dilate, rhs_dilate = window[int(label)] if int(label) < len(window) else (
            rhs[d], (0, 0), 1, 1, 1)
        outputs = out[out_labels.index(label)] if label in out_labels else 1
        taps *= _taps(outputs, size, lo, stride, lhs_dilate, rhs_dilate,
                      lhs[lhs_labels.index(label)] if label in lhs_labels else 1)
    return 2 * math.prod(out) // max(1, math.prod(out[i] for i, c in enumerate(out_labels) if c.isdigit())) \
        * features * taps


def window_taps(inst: Inst, operand: str) -> int:
    """A reduce-window's (output element, window tap) pairs that read its operand (padding left
    out): its work. jax.nn.log_softmax's max over a row, as libtpu may lower it: a window the row's
    width wide, padded on both sides, at each of the row's elements.

    >>> rw = '%r = f32[4,8192]{1,0} reduce-window(%x, %c), window={size=1x16383 pad=0_0x8191_8191}, to_apply=%m'
    >>> window_taps(_instruction(rw), "f32[4,8192]") == 4 * 8192 * 8192
    True
    """
    dims, out = _first_dims(operand), _first_dims(inst.type)
    window = _window(inst.attrs)
    if len(window) != len(dims) or len(out) != len(dims):
        return math.prod(out)
    return math.prod(_taps(o, size, lo, stride, lhs, rhs, n)
                     for o, n, (size, (lo, _), stride, lhs, rhs) in zip(out, dims, window, strict=True))


def _sublane(inst: Inst) -> bool:
    """Whether libtpu emits a reduce-window kernel down its tile's sublanes (the window along the
    layout's second-minor dimension: an attention's softmax over keys) rather than along its lanes
    (the minor one: a log-softmax over a vocabulary): its backend_config names the emitter.

    >>> _sublane(_instruction('%f = f32[8]{0} fusion(%x), kind=kOutput, calls=%c, backend_config='
    ...                       '{"convolution_algorithm_config":{"emitter":"EmitReduceWindowSublane"}}'))
    True
    """
    config = inst.backend_config().get("convolution_algorithm_config")
    return isinstance(config, dict) and config.get("emitter") == "EmitReduceWindowSublane"


def _window(attrs: str) -> list[tuple[int, tuple[int, int], int, int, int]]:
    """Each spatial dimension's (size, padding, stride, lhs dilation, rhs dilation) of `window={...}`."""
    found = re.search(r"window=\{([^}]*)\}", attrs)
    fields = dict(re.findall(r"(\w+)=([\w\-]+)", found.group(1))) if found else {}
    sizes = [int(x) for x in fields.get("size", "").split("x") if x]

    def each(key: str, default: str) -> list[str]:
        got = fields.get(key, "").split("x") if key in fields else []
        return got if len(got) == len(sizes) else [default] * len(sizes)

    pads = [tuple(int(x) for x in p.split("_")) for p in each("pad", "0_0")]
    return [(n, (p[0], p[1]), int(s), int(ld), int(rd)) for n, p, s, ld, rd in
            zip(sizes, pads, each("stride", "1"), each("lhs_dilate", "1"), each("rhs_dilate", "1"), strict=True)]


def _taps(outputs: int, size: int, lo: int, stride: int, lhs_dilate: int, rhs_dilate: int, inputs: int) -> int:
    """The (output position, window tap) pairs of one spatial dimension that read an input element
    (tap w of output p reads padded position p stride + w rhs_dilate - lo).

    >>> _taps(16, 16, 15, 1, 1, 1, 1), _taps(1, 4, 0, 1, 1, 1, 4), _taps(3, 3, 1, 1, 1, 1, 3)
    (16, 4, 7)
    """
    last = (inputs - 1) * lhs_dilate  # the padded input's last element
    if lhs_dilate == 1:
        count = 0
        for w in range(size):
            start = w * rhs_dilate - lo  # where output 0 reads; output p reads start + p stride
            first = -(start // stride) if start < 0 else 0
            end = min(outputs - 1, (last - start) // stride) if last >= start else -1
            count += max(0, end - first + 1)
        return count
    p = np.arange(outputs)[:, None] * stride + np.arange(size)[None, :] * rhs_dilate - lo
    return int(np.count_nonzero((p >= 0) & (p <= last) & (p % lhs_dilate == 0)))


def _attention_flops(ins: list[str], target: str, attrs: str) -> int:
    """Fused attention: QK^T and PV (4 x B x Sq x H x D x Sk) forward, two and a half times that
    backward (dQ, dK, dV and the scores again); half under a causal mask. Q and K are [B, S, H, D]."""
    if len(ins) < 2:
        return 0
    q, k = _first_dims(ins[0]), _first_dims(ins[1])
    if len(q) != 4 or len(k) != 4:
        return 0
    forward = 4 * math.prod(q) * k[1]
    factor = 2.5 if ("backward" in target or "bwd" in target) else 1.0
    if "causal" in attrs:
        factor /= 2
    return int(forward * factor)


_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')


def _cycles(inst: Inst) -> int:
    """libtpu's estimate of a kernel's cycles (its backend_config's `window_config`), 0 where none."""
    found = _CYCLES.search(inst.attrs)
    return int(found.group(1)) if found else 0


def _trip_count(inst: Inst) -> int:
    known = inst.backend_config().get("known_trip_count")
    if isinstance(known, dict) and str(known.get("n", "")).isdigit():
        return int(known["n"])
    return 1


def entry_arrays(hlo_text: str) -> int:
    """The arrays one call of the program passes: its entry computation's parameters (a jitted
    step's flattened arguments: parameters, optimizer state, batch), each one buffer the host hands
    the device per step.

    >>> entry_arrays("HloModule m\\n\\nENTRY %main (a: f32[2], b: f32[2]) -> f32[2] {\\n"
    ...              "  %a = f32[2]{0} parameter(0)\\n  %b = f32[2]{0} parameter(1)\\n"
    ...              "  ROOT %c = f32[2]{0} add(f32[2]{0} %a, f32[2]{0} %b)\\n}\\n")
    2
    """
    start = hlo_text.find("ENTRY ")  # only the entry computation is read (`step_kernels` parses the rest)
    if start < 0:
        return 0
    end = hlo_text.find("\n}", start)
    return len(_PARAMETER.findall(hlo_text, start, end if end >= 0 else len(hlo_text)))


_PARAMETER = re.compile(r" parameter\(\d+\)")


def step_kernels(hlo_text: str, devices: int = 1, gpus_per_host: int = 8, on_chip: str = "") -> tuple[Kernel, ...]:
    """The kernels one step runs, from its optimized HLO text (`compiled.as_text()`); `on_chip`:
    the mark of the memory space a kernel reads without HBM (a TPU's VMEM: `VMEM`, below)."""
    comps, entry = parse_module(hlo_text)
    found = tuple(_Reader(comps, devices, gpus_per_host, on_chip).kernels(entry))
    if not on_chip:
        return found
    # what each kernel moves in every memory space, less its HBM bytes: what it moves in VMEM
    everywhere = {k.name: k.bytes for k in _Reader(comps, devices, gpus_per_host).kernels(entry)}
    return tuple(dataclasses.replace(k, vmem_bytes=max(0, everywhere.get(k.name, k.bytes) - k.bytes))
                 if not (k.vmem_copy or k.waits_for) else k for k in found)

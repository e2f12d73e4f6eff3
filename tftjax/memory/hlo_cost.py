"""What a compiled step asks of a GPU, read from its optimised HLO (``compiled.as_text()``):
kernel launches, HBM bytes and matmul FLOPs per step, with every while loop's body
multiplied by its known trip count.

XLA's own cost analysis counts a loop body once (checked: a 60-step scan of one matmul
reports one step's FLOPs), and a compile-only GPU executable has none, so the census is
made here from the program text:

- **kernels**: every instruction of the entry computation that launches work on the device
  (fusions, library calls such as cuBLAS GEMMs, copies; not parameters, tuples,
  get-tuple-elements, bitcasts or constants), plus each while loop's body and condition
  times its trip count (condition: trips + 1), and the computations of calls and
  conditionals (a conditional's costliest branch).
- **HBM bytes**: per launch, what it reads (its operands) and writes (its results), as
  XLA's GPU cost model counts them: a fusion operand only sliced inside the fusion
  (``dynamic-slice``, ``slice``) counts the slices it reads, and a buffer updated in place
  (``dynamic-update-slice``, the scan's stacked residuals) counts the update, not the
  buffer. Caches are not modelled: every launch reads its inputs from HBM.
- **FLOPs**: matmuls only (``dot`` anywhere, cuBLAS GEMM custom calls, and Pallas kernels that
  state theirs as ``matmul_flops`` metadata): 2 · outputs ·
  contracted size. Element-wise work is memory-bound and is in the bytes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

SIZES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_ARRAY = re.compile(r"\b(pred|bf16|c64|c128|[suf]\d+|f8e\w+)\[([\d,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][a-z0-9\-]*)\((.*)$")
_OPERAND = re.compile(r"%([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
NO_LAUNCH = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "while",
        "conditional",
        "call",
        "after-all",
        "add-dependency",
        "opt-barrier",
        "partition-id",
        "replica-id",
        "domain",
        "copy-done",
        "send-done",
        "recv-done",
        "all-reduce-done",
        "all-gather-done",
        "collective-permute-done",
        "async-done",
        "async-update",
        "get-dimension-size",
    }
)
SLICES = frozenset({"dynamic-slice", "slice"})
_KERNEL_FLOPS = re.compile(r'matmul_flops(?:\\22|\\*")\s*:\s*(?:\\22|\\*")(\d+)')
"""A Pallas kernel's own FLOPs in its serialised metadata (quotes escaped as ``\\22``)."""
GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8")


@dataclasses.dataclass
class Instr:
    name: str
    shape: str
    opcode: str
    operands: list[str]
    attrs: str


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape (a tuple's: the sum of its arrays)."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        total += n * SIZES.get(dtype, 1)
    return total


def shape_dims(shape: str) -> list[int]:
    m = _ARRAY.search(shape)
    return [int(d) for d in m.group(2).split(",") if d] if m else []


def _split_call(rest: str) -> tuple[str, str]:
    """``rest`` after ``opcode(``: (the operand list, the attributes after it)."""
    depth = 1
    for i, ch in enumerate(rest):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
            if depth == 0:
                return rest[:i], rest[i + 1 :]
    return rest, ""


def parse(text: str) -> tuple[dict[str, list[Instr]], dict[str, Instr], str]:
    """The module's computations (name → instructions), each one's ROOT instruction, and the
    entry computation's name."""
    comps: dict[str, list[Instr]] = {}
    roots: dict[str, Instr] = {}
    entry, current = "", None
    for line in text.splitlines():
        if current is None:
            h = _HEADER.match(line)
            if h:
                current = h.group(2)
                comps[current] = []
                if h.group(1):
                    entry = current
            continue
        if line.startswith("}"):
            current = None
            continue
        m = _INSTR.match(line)
        if m:
            operands, attrs = _split_call(m.group(5))
            ins = Instr(m.group(2), m.group(3), m.group(4), _OPERAND.findall(operands), attrs)
            comps[current].append(ins)
            if m.group(1):
                roots[current] = ins
    if not entry:
        raise ValueError("no ENTRY computation in the HLO text")
    return comps, roots, entry


def _called(attrs: str, key: str) -> list[str]:
    m = re.search(key + r"=\{([^}]*)\}", attrs)
    if m:
        return _OPERAND.findall(m.group(1))
    m = re.search(key + r"=%([\w.\-]+)", attrs)
    return [m.group(1)] if m else []


@dataclasses.dataclass
class Census:
    kernels: float = 0.0
    hbm_bytes: float = 0.0
    flops: float = 0.0
    loops: list = dataclasses.field(default_factory=list)
    """(op_name of the loop, trip count, kernels of one trip) per while loop."""

    def as_dict(self) -> dict:
        return {
            "kernels": int(self.kernels),
            "hbm_bytes": int(self.hbm_bytes),
            "flops": int(self.flops),
            "loops": self.loops,
        }


class Program:
    """The census of one optimised HLO module."""

    def __init__(self, text: str):
        self.comps, self.roots, self.entry = parse(text)
        self.shapes = {c: {i.name: i.shape for i in body} for c, body in self.comps.items()}

    def census(self) -> Census:
        out = Census()
        self._walk(self.entry, 1.0, out)
        return out

    # -- walking the call graph ------------------------------------------------------------

    def _walk(self, comp: str, mult: float, out: Census) -> None:
        for ins in self.comps[comp]:
            op = ins.opcode
            if op == "while":
                m = _TRIP.search(ins.attrs)
                trips = int(m.group(1)) if m else 1
                body, cond = _called(ins.attrs, "body"), _called(ins.attrs, "condition")
                before = out.kernels
                for c in body:
                    self._walk(c, mult * trips, out)
                for c in cond:
                    self._walk(c, mult * (trips + 1), out)
                name = re.search(r'op_name="([^"]*)"', ins.attrs)
                out.loops.append(
                    (
                        name.group(1) if name else ins.name,
                        trips,
                        (out.kernels - before) / max(mult * trips, 1),
                    )
                )
            elif op == "call":
                for c in _called(ins.attrs, "to_apply"):
                    self._walk(c, mult, out)
            elif op == "conditional":
                branches = _called(ins.attrs, "branch_computations") or (
                    _called(ins.attrs, "true_computation") + _called(ins.attrs, "false_computation")
                )
                subs = []
                for c in branches:
                    sub = Census()
                    self._walk(c, 1.0, sub)
                    subs.append(sub)
                if subs:
                    worst = max(subs, key=lambda s: s.hbm_bytes + s.kernels)
                    out.kernels += mult * worst.kernels
                    out.hbm_bytes += mult * worst.hbm_bytes
                    out.flops += mult * worst.flops
                out.kernels += mult  # the predicate's launch
            elif op not in NO_LAUNCH:
                out.kernels += mult
                out.hbm_bytes += mult * self._launch_bytes(comp, ins)
                out.flops += mult * self._launch_flops(comp, ins)

    # -- bytes --------------------------------------------------------------------------------

    def _operand_bytes(self, comp: str, name: str) -> int:
        return shape_bytes(self.shapes[comp].get(name, ""))

    def _launch_bytes(self, comp: str, ins: Instr) -> int:
        if ins.opcode == "fusion":
            fused = _called(ins.attrs, "calls")
            if fused and fused[0] in self.comps:
                return self._fusion_bytes(comp, ins, fused[0])
        written = shape_bytes(ins.shape)
        if ins.opcode == "dynamic-update-slice" and len(ins.operands) > 1:
            update = self._operand_bytes(comp, ins.operands[1])
            return 2 * update  # the update read, written in place
        if ins.opcode in SLICES:
            return 2 * written
        return written + sum(self._operand_bytes(comp, o) for o in ins.operands)

    def _fusion_bytes(self, comp: str, ins: Instr, fused: str) -> int:
        body = self.comps[fused]
        users: dict[str, list[Instr]] = {}
        for i in body:
            for o in i.operands:
                users.setdefault(o, []).append(i)
        read = sum(
            self._param_read(users, i.name, i.shape) for i in body if i.opcode == "parameter"
        )
        return read + self._written(fused, self.roots.get(fused))

    @staticmethod
    def _param_read(users, pname: str, pshape: str) -> int:
        """Bytes a fusion reads of one parameter: its slices, nothing for a buffer updated in
        place, else the whole array."""
        total, seen = 0, [pname]
        frontier = list(users.get(pname, []))
        while frontier:
            u = frontier.pop()
            if u.opcode == "bitcast":
                frontier.extend(users.get(u.name, []))
                continue
            if u.opcode in SLICES and u.operands and u.operands[0] in seen:
                total += shape_bytes(u.shape)
            elif u.opcode == "dynamic-update-slice" and u.operands and u.operands[0] in seen:
                continue
            else:
                return shape_bytes(pshape)
            seen.append(u.name)
        return total

    def _written(self, fused: str, root: Instr | None) -> int:
        if root is None:
            return 0
        shapes = self.shapes[fused]
        by_name = {i.name: i for i in self.comps[fused]}
        parts = [by_name.get(o) for o in root.operands] if root.opcode == "tuple" else [root]
        total = 0
        for p in parts:
            if p is None:
                continue
            while p.opcode == "bitcast" and p.operands and p.operands[0] in by_name:
                p = by_name[p.operands[0]]
            if p.opcode == "dynamic-update-slice" and len(p.operands) > 1:
                total += shape_bytes(shapes.get(p.operands[1], ""))
            else:
                total += shape_bytes(p.shape)
        return total

    # -- FLOPs --------------------------------------------------------------------------------

    def _launch_flops(self, comp: str, ins: Instr) -> float:
        if ins.opcode == "fusion":
            fused = _called(ins.attrs, "calls")
            return sum(self._comp_flops(c) for c in fused if c in self.comps)
        if ins.opcode == "dot":
            return self._dot_flops(comp, ins)
        if ins.opcode == "custom-call" and any(t in ins.attrs for t in GEMM_TARGETS):
            return self._gemm_flops(comp, ins)
        if ins.opcode == "custom-call":  # a Pallas kernel that states its own (pallas_vsn)
            m = _KERNEL_FLOPS.search(ins.attrs)
            return float(m.group(1)) if m else 0.0
        return 0.0

    def _comp_flops(self, comp: str) -> float:
        total = 0.0
        for i in self.comps[comp]:
            if i.opcode == "dot":
                total += self._dot_flops(comp, i)
            elif i.opcode == "fusion":
                total += sum(
                    self._comp_flops(c) for c in _called(i.attrs, "calls") if c in self.comps
                )
        return total

    def _dot_flops(self, comp: str, ins: Instr) -> float:
        m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", ins.attrs)
        lhs = shape_dims(self.shapes[comp].get(ins.operands[0], "")) if ins.operands else []
        k = math.prod(lhs[int(d)] for d in m.group(1).split(",") if d) if m and lhs else 1
        return 2.0 * math.prod(shape_dims(ins.shape) or [1]) * k

    def _gemm_flops(self, comp: str, ins: Instr) -> float:
        m = re.search(r'"lhs_contracting_dimensions"\s*:\s*\[([^\]]*)\]', ins.attrs)
        lhs = shape_dims(self.shapes[comp].get(ins.operands[0], "")) if ins.operands else []
        dims = json.loads("[" + m.group(1) + "]") if m else []
        k = math.prod(lhs[int(d)] for d in dims) if lhs and dims else 1
        return 2.0 * math.prod(shape_dims(ins.shape) or [1]) * k

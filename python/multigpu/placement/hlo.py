"""The text of a compiled XLA program, read for what each device runs.

`jax.stages.Compiled.as_text()` prints the program XLA compiled after its
SPMD partitioner split it: one program that every device of the executable
runs (`num_partitions` of them), its shapes the shapes of one device's
share. This module reads that text: the entry parameters (one per
flattened argument of the jitted function, kept with `keep_unused=True`),
the slices of an argument each device takes (a `dynamic-slice` whose
offset depends on `partition-id`, after a `pad` when the rows do not
divide), the collectives (`all-reduce`, `all-gather`, ...) and the number
of instructions.

The format is XLA's HLO text (https://openxla.org/xla/operation_semantics);
only what the report needs is parsed.
"""

import collections
import math
import re

# Bytes of one element of each HLO element type.
ELEMENT_BYTES = {
    "pred": 1, "s2": 1, "s4": 1, "s8": 1, "u2": 1, "u4": 1, "u8": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}

# Collectives, by HLO opcode; an asynchronous pair counts at its `-start`.
COLLECTIVE_OPS = frozenset({
    "all-reduce", "all-reduce-start", "all-gather", "all-gather-start",
    "reduce-scatter", "all-to-all", "ragged-all-to-all",
    "collective-permute", "collective-permute-start", "collective-broadcast",
})

# Instructions that hold or route values rather than compute.
PLUMBING_OPS = frozenset({
    "parameter", "constant", "tuple", "get-tuple-element", "bitcast",
    "partition-id", "replica-id", "after-all", "opt-barrier",
})

# Instructions a row slice is followed through to the argument it reads.
_PASS_THROUGH = frozenset({"copy", "bitcast"})

# Attributes naming the computations control flow runs (not fused ones).
_CONTROL_FLOW = re.compile(
    r"\b(?:body|condition|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
_CALLS = re.compile(r"\bcalls=%?([\w.\-]+)")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")
_METADATA = re.compile(r",\s*metadata=\{[^{}]*\}")
_COMMENT = re.compile(r"/\*.*?\*/")

Instruction = collections.namedtuple(
    "Instruction", ["name", "shape", "opcode", "operands", "attributes"])
Instruction.__doc__ = """One HLO instruction: `name = shape opcode(operands), attributes`."""

Slice = collections.namedtuple("Slice", ["parameter", "rows", "padded_rows", "low"])
Slice.__doc__ = """Each device's rows of an entry parameter, from a partitioned slice.

`rows` is the slice's size along the first axis, `padded_rows` the first
axis after the pad XLA added (the parameter's own rows when none), `low`
the rows padded before the parameter's first row. Device `i` of the
executable holds rows `[i * rows, (i + 1) * rows)` of the padded array.
"""

Collective = collections.namedtuple("Collective", ["name", "op", "bytes", "pairs"])
Collective.__doc__ = """One collective instruction.

`bytes` are what each device puts in (its operands' bytes); `pairs` the
`(source, target)` partitions of a `collective-permute`, else None.
"""


def shape_bytes(shape):
    """Bytes of an HLO shape (a tuple's elements summed): `f32[4,3]` is 48.

    Example:
    >>> shape_bytes("(f32[], f32[8,6]{1,0})")
    196
    """
    total = 0
    for element, dims in _ARRAY.findall(shape):
        size = ELEMENT_BYTES.get(element)
        if size is None:
            continue
        total += size * math.prod(int(d.lstrip("<=")) for d in dims.split(",") if d)
    return total


def shape_dims(shape):
    """The dimensions of an array shape: `f32[16,6]{1,0}` gives `(16, 6)`."""
    found = _ARRAY.search(shape)
    if found is None:
        return ()
    return tuple(int(d.lstrip("<=")) for d in found.group(2).split(",") if d)


def _closing(text, start):
    """Index of the parenthesis closing the one at `text[start]`."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "({":
            depth += 1
        elif text[i] in ")}":
            depth -= 1
            if depth == 0:
                return i
    return len(text)


def _split_top(text):
    """`text` split at its commas outside brackets."""
    parts, depth, current = [], 0, []
    for char in text:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def parse_instruction(line):
    """An `Instruction` from one line of HLO text, or None for another line."""
    found = _INSTRUCTION.match(line)
    if found is None:
        return None
    name, rest = found.group(1), found.group(2).strip()
    if rest.startswith("("):
        end = _closing(rest, 0)
        shape, rest = rest[: end + 1], rest[end + 1:].strip()
    else:
        shape, _, rest = rest.partition(" ")
    opcode = re.match(r"([\w\-]+)\(", rest)
    if opcode is None:
        return None
    start = opcode.end() - 1
    end = _closing(rest, start)
    operands = [part.split()[-1].lstrip("%")
                for part in _split_top(rest[start + 1: end])]
    return Instruction(name, shape, opcode.group(1), operands,
                       rest[end + 1:].lstrip(", "))


class Module:
    """A compiled HLO module's text, parsed into its computations.

    Args:
        text: What `jax.stages.Compiled.as_text()` returns.

    Attributes:
        computations: `{name: {instruction name: Instruction}}`, in order.
        entry: The entry computation's name.
        num_partitions: Devices the program is partitioned over (1 when
            the module does not say).

    Example:
    >>> module = Module(compiled.as_text())
    >>> module.num_partitions
    4
    """

    def __init__(self, text):
        self.computations = {}
        self.entry = None
        partitions = re.search(r"\bnum_partitions=(\d+)", text.split("\n", 1)[0])
        self.num_partitions = int(partitions.group(1)) if partitions else 1
        current = None
        for raw in text.splitlines():
            line = _COMMENT.sub("", _METADATA.sub("", raw))
            header = _HEADER.match(line)
            if header and "=" not in line.split("(", 1)[0]:
                current = self.computations.setdefault(header.group(2), {})
                if header.group(1):
                    self.entry = header.group(2)
                continue
            if line.strip() == "}":
                current = None
                continue
            if current is not None:
                instruction = parse_instruction(line)
                if instruction is not None:
                    current[instruction.name] = instruction
        if self.entry is None:
            raise ValueError("The HLO text has no ENTRY computation.")
        self.callers = collections.defaultdict(list)
        for computation, instructions in self.computations.items():
            for instruction in instructions.values():
                for called in _CALLS.findall(instruction.attributes):
                    self.callers[called].append((computation, instruction))

    def parameters(self, computation=None):
        """`{parameter number: Instruction}` of a computation (the entry's)."""
        instructions = self.computations[computation or self.entry]
        return {int(i.operands[0]): i for i in instructions.values()
                if i.opcode == "parameter"}

    def executed_computations(self):
        """The entry and the computations its control flow runs."""
        order, seen = [self.entry], {self.entry}
        for name in order:
            for instruction in self.computations.get(name, {}).values():
                called = _CONTROL_FLOW.findall(instruction.attributes)
                for branches in _BRANCHES.findall(instruction.attributes):
                    called += [b.strip().lstrip("%") for b in branches.split(",")]
                for other in called:
                    if other not in seen and other in self.computations:
                        seen.add(other)
                        order.append(other)
        return order

    def op_count(self):
        """Instructions each device runs, without plumbing (fusions count once)."""
        return sum(
            1 for name in self.executed_computations()
            for i in self.computations[name].values()
            if i.opcode not in PLUMBING_OPS)

    def collectives(self):
        """The collectives each device runs, a list of `Collective`."""
        found = []
        for name in self.executed_computations():
            instructions = self.computations[name]
            for i in instructions.values():
                if i.opcode not in COLLECTIVE_OPS:
                    continue
                nbytes = sum(shape_bytes(instructions[o].shape)
                             for o in i.operands if o in instructions)
                pairs = re.search(r"source_target_pairs=\{(.*?)\}\}", i.attributes)
                found.append(Collective(
                    i.name, i.opcode.removesuffix("-start"), nbytes,
                    None if pairs is None else [
                        tuple(int(v) for v in p.split(","))
                        for p in re.findall(r"\{(\d+,\d+)", pairs.group(0))]))
        return found

    def _origin(self, computation, name, depth=0):
        """`(entry parameter number, low pad, padded rows)` that `name` reads.

        Followed through copies and pads, and from a fused computation's
        parameter to the operand of the fusion that calls it; None when
        `name` is computed otherwise.
        """
        instruction = self.computations[computation].get(name)
        if instruction is None or depth > 64:
            return None
        if instruction.opcode == "parameter":
            number = int(instruction.operands[0])
            if computation == self.entry:
                return number, 0, shape_dims(instruction.shape)[:1]
            origins = {self._origin(caller, call.operands[number], depth + 1)
                       for caller, call in self.callers.get(computation, [])
                       if number < len(call.operands)}
            return origins.pop() if len(origins) == 1 else None
        if instruction.opcode in _PASS_THROUGH:
            return self._origin(computation, instruction.operands[0], depth + 1)
        if instruction.opcode == "pad":
            inner = self._origin(computation, instruction.operands[0], depth + 1)
            padding = re.search(r"\bpadding=(-?\d+)_(-?\d+)", instruction.attributes)
            if inner is None or padding is None:
                return None
            low = int(padding.group(1))
            return inner[0], inner[1] + low, shape_dims(instruction.shape)[:1]
        return None

    def _depends_on_partition(self, computation, name, depth=0):
        """Whether `name`'s value is computed from the device's `partition-id`."""
        instruction = self.computations[computation].get(name)
        if instruction is None or depth > 64:
            return False
        if instruction.opcode == "partition-id":
            return True
        if instruction.opcode == "parameter":
            number = int(instruction.operands[0])
            return any(
                number < len(call.operands)
                and self._depends_on_partition(caller, call.operands[number], depth + 1)
                for caller, call in self.callers.get(computation, []))
        return any(self._depends_on_partition(computation, o, depth + 1)
                   for o in instruction.operands)

    def row_slices(self):
        """Each device's slice of the entry parameters it splits by rows.

        A slice is a `dynamic-slice` of an entry parameter (through copies
        and pads) whose first offset depends on `partition-id`: every
        device takes its own rows.

        Returns:
            `{entry parameter number: Slice}`.
        """
        slices = {}
        for computation, instructions in self.computations.items():
            for i in instructions.values():
                if i.opcode != "dynamic-slice" or len(i.operands) < 2:
                    continue
                origin = self._origin(computation, i.operands[0])
                if origin is None or not origin[2]:
                    continue
                if not self._depends_on_partition(computation, i.operands[1]):
                    continue
                rows = shape_dims(i.shape)[:1]
                if rows:
                    slices.setdefault(origin[0], Slice(
                        origin[0], rows[0], origin[2][0], origin[1]))
        return slices

    def parameter_bytes(self, number):
        """Bytes of one device's share of entry parameter `number`."""
        return shape_bytes(self.parameters()[number].shape)

    def parameter_rows(self, number):
        """The first dimension of entry parameter `number` (None for a scalar)."""
        dims = shape_dims(self.parameters()[number].shape)
        return dims[0] if dims else None


def rows_of_slice(total, found, partition):
    """Real rows of a `total`-row argument in device `partition`'s slice.

    XLA pads the rows to `found.padded_rows` (`found.low` before them) and
    gives device `partition` rows `[partition * found.rows, ...)` of the
    padded array; the padding is not the caller's data.

    Example:
    >>> rows_of_slice(10, Slice(0, 3, 12, 0), 3)   # 10 rows on 4 devices
    1
    """
    start = partition * found.rows
    end = start + found.rows
    return max(0, min(end, found.low + total) - max(start, found.low))

"""The wire protocol as include/ivcuda/proto.h (and nvml_wire.h) declare it, read from the
headers themselves: the op table, the constants, and every struct's fields, sizes and offsets
(natural alignment, as the x86-64 ABI lays them out). make_seeds.py packs requests by field
name with it, so that a seed follows the header when a struct or the op table changes; the
sizes are checked against the headers' own static_asserts. Also the CUDA constants of cuda.h
(enumerators and #defines), so that seeds name CU_* values instead of numbers.
"""
import os
import re
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")

# Scalar types of the headers: (size, struct format).
SCALARS = {
    "u8": (1, "B"), "char": (1, "B"), "std::uint8_t": (1, "B"),
    "u16": (2, "H"), "std::uint16_t": (2, "H"),
    "u32": (4, "I"), "std::uint32_t": (4, "I"), "i32": (4, "i"), "std::int32_t": (4, "i"),
    "float": (4, "f"),
    "u64": (8, "Q"), "std::uint64_t": (8, "Q"), "std::int64_t": (8, "q"),
}


def _strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


class Field:
    def __init__(self, name, type_name, count, offset, size, align):
        self.name, self.type, self.count, self.offset, self.size, self.align = (
            name, type_name, count, offset, size, align)


class Struct:
    def __init__(self, name):
        self.name, self.fields, self.size, self.align = name, [], 0, 1

    def field(self, name):
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"{self.name} has no field {name}")


class Proto:
    def __init__(self, root=ROOT):
        texts = [_strip_comments(open(os.path.join(root, "include", "ivcuda", h)).read())
                 for h in ("nvml_wire.h", "proto.h")]
        self.consts = {}
        self.structs = {}
        self.aliases = {}
        for t in texts:
            for name, expr in re.findall(r"inline constexpr [\w:]+ (k\w+) = ([^;]+);", t):
                self.consts[name] = self.eval(expr)
            for name, target in re.findall(r"using (\w+) = [\w:]*::(\w+);", t):
                self.aliases[name] = target
            for name, body in re.findall(r"struct (\w+) \{([^}]*)\};", t):
                self._add_struct(name, body)
        proto = texts[1]
        table = proto[proto.index("#define IVCUDA_OPS(X)"):]
        table = table[:table.index("\n\n")]
        self.ops = {}  # name -> (number, request struct, reply struct, needs_reply)
        for i, (name, req, rep, sync) in enumerate(re.findall(r"X\((\w+),\s*(\w+),\s*(\w+),\s*(\d)\)", table)):
            self.ops[name] = (i + 1, req, rep, sync == "1")
        nvml = texts[0]
        body = nvml[nvml.index("enum class NvmlFn"):]
        body = body[body.index("{") + 1:body.index("};")]
        self.nvml_fns = {n: i + 1 for i, n in enumerate(re.findall(r"^\s*(k\w+)", body, re.M))}
        # The headers' own size checks hold for this reading of them.
        for name, expr in re.findall(r"static_assert\(sizeof\((\w+)\) == ([^;]+)\);", proto):
            got, want = self.struct(name).size, self.eval(expr.rstrip(")"))
            if got != want:
                raise ValueError(f"proto_layout: sizeof({name}) read as {got}, the header says {want}")

    def eval(self, expr):
        e = re.sub(r"(\d+)u\b", r"\1", expr.strip())
        e = re.sub(r"\bk\w+", lambda m: str(self.consts[m.group(0)]), e)
        if not re.fullmatch(r"[\d\s+*<>()x a-fA-F-]+", e):
            raise ValueError(f"proto_layout: cannot evaluate {expr!r}")
        return int(eval(e, {"__builtins__": {}}))  # digits and operators only (checked above)

    def _add_struct(self, name, body):
        s = Struct(name)
        off = 0
        for decl in body.split(";"):
            decl = decl.strip()
            if not decl:
                continue
            m = re.fullmatch(r"([\w:]+)\s+(\w+)(?:\[([^\]]+)\])?", decl)
            if m is None:
                raise ValueError(f"proto_layout: {name}: cannot read {decl!r}")
            tname, fname, count = m.group(1), m.group(2), m.group(3)
            n = self.eval(count) if count else 0
            if tname in SCALARS:
                size = align = SCALARS[tname][0]
            else:
                sub = self.struct(tname)
                size, align = sub.size, sub.align
            off = (off + align - 1) // align * align
            s.fields.append(Field(fname, tname, n, off, size * max(n, 1), align))
            off += size * max(n, 1)
            s.align = max(s.align, align)
        s.size = (off + s.align - 1) // s.align * s.align
        self.structs[name] = s

    def struct(self, name):
        return self.structs[self.aliases.get(name, name)]

    def op(self, name):
        return self.ops[name][0]

    def request(self, op):
        return self.ops[op][1]

    def reply(self, op):
        return self.ops[op][2]

    def pack(self, struct_name, **values):
        """The struct's bytes: named fields set (ints, floats, bytes for byte arrays, lists for
        arrays, dicts for nested structs), every other byte zero. An unknown name is an error."""
        s = self.struct(struct_name)
        out = bytearray(s.size)
        for key, v in values.items():
            f = s.field(key)
            out[f.offset:f.offset + f.size] = self._pack_field(f, v)
        return bytes(out)

    def _pack_field(self, f, v):
        if f.type in SCALARS:
            size, fmt = SCALARS[f.type]
            if f.count:
                if isinstance(v, (bytes, bytearray)):
                    if size != 1 or len(v) > f.count:
                        raise ValueError(f"{f.name}: {len(v)} bytes do not fit")
                    return bytes(v) + bytes(f.size - len(v))
                vals = list(v) + [0] * (f.count - len(v))
                return struct.pack("<" + fmt * f.count, *vals)
            if fmt in "BHIQ":
                v &= (1 << (8 * size)) - 1
            return struct.pack("<" + fmt, v)
        sub = self.struct(f.type)
        if f.count:
            items = list(v) + [{}] * (f.count - len(v))
            return b"".join(self.pack(f.type, **i) for i in items)
        return v if isinstance(v, (bytes, bytearray)) else self.pack(sub.name, **v)

    def word(self, struct_name, field):
        """Which 8-byte word of the struct a u64 field is."""
        f = self.struct(struct_name).field(field)
        if f.offset % 8 != 0:
            raise ValueError(f"{struct_name}.{field} is not at an 8-byte boundary")
        return f.offset // 8


def cuda_constants(cuda_h=None):
    """CU_*/CUDA_* enumerators and #defines of cuda.h: name -> int."""
    cands = [cuda_h or os.environ.get("IVCUDA_CUDA_H")]
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base:
            cands.append(os.path.join(base, "include", "cuda.h"))
    path = next((c for c in cands if c and os.path.exists(c)), None)
    if path is None:
        raise SystemExit("proto_layout: no cuda.h (IVCUDA_CUDA_H or CUDA_HOME name it)")
    text = _strip_comments(open(path).read())
    consts = {}
    for name, val in re.findall(r"^#define\s+(CU(?:DA)?_\w+)\s+\(?(0x[0-9a-fA-F]+|\d+)U?L?L?\)?\s*$", text, re.M):
        consts.setdefault(name, int(val, 0))
    # Enumerators, implicit values counted on from the last explicit one.
    for body in re.findall(r"\benum\s+\w*\s*\{([^}]*)\}", text):
        nxt = 0
        for item in body.split(","):
            m = re.fullmatch(r"\s*(\w+)\s*(?:=\s*(.+?))?\s*", item, re.S)
            if m is None:
                continue
            name, expr = m.group(1), m.group(2)
            if expr is not None:
                e = re.sub(r"\b([0-9a-fA-Fx]+)[uUlL]+\b", r"\1", expr)
                e = re.sub(r"\b[A-Za-z_]\w*\b", lambda k: str(consts.get(k.group(0), "None")), e)
                if not re.fullmatch(r"[\d\sx a-fA-F()+*|&<>~-]+", e):
                    continue
                try:
                    nxt = int(eval(e, {"__builtins__": {}}))  # digits and operators only (checked above)
                except (SyntaxError, TypeError, ValueError):
                    continue
            if name.startswith("CU"):
                consts.setdefault(name, nxt)
            nxt += 1
    return consts

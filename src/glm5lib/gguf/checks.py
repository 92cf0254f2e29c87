"""What can be wrong inside one GGUF file whose header parsed.

A problem is `fatal` when tensor data cannot be located or read (unknown type, data past the end of the file,
duplicate names). The others break llama.cpp compatibility (it refuses such files, and split/merge could not
be byte-identical) but leave every tensor readable, so `open_gguf` accepts them while split, merge and
validate do not. A `layout` problem (data misaligned, or overlapping another tensor's) is not fatal to
`open_gguf`, so `inspect` can show such a file, but every read of tensor data refuses it, as llama.cpp does.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from glm5lib.gguf.format import (
    ALIGNMENT,
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    KEY_ALIGNMENT,
    GGUFHeader,
    pad,
    type_name,
)


@dataclass(frozen=True)
class Problem:
    message: str
    fatal: bool
    layout: bool = False  # tensor data cannot be trusted: reads refuse the file

    def __str__(self) -> str:
        return self.message


def file_problems(h: GGUFHeader) -> list[Problem]:
    """Every problem in one file, in file order."""
    out: list[Problem] = []
    name = h.path.name

    def add(msg: str, fatal: bool, layout: bool = False) -> None:
        out.append(Problem(f"{name}: {msg}", fatal, layout))

    for key in sorted(set(h.duplicate_keys)):
        add(f"duplicate metadata key '{key}'", True)
    if KEY_ALIGNMENT in h.kv:
        value, vtype = h.get(KEY_ALIGNMENT), h.kv_type(KEY_ALIGNMENT)
        if vtype != GGUFValueType.UINT32 or not isinstance(value, int) or value <= 0 or value & (value - 1):
            add(f"{KEY_ALIGNMENT} must be a power-of-two u32, got {value!r} ({vtype.name if vtype else '?'})", True)
        elif value != ALIGNMENT:
            add(f"alignment {value} is not {ALIGNMENT} (llama.cpp's gguf-split writes {ALIGNMENT})", False)

    seen: set[str] = set()
    expected: int | None = 0  # llama.cpp requires each offset to follow the previous tensor, padded
    out_of_place: list[str] = []  # reported once per file: one bad offset displaces every later expectation
    spans: list[tuple[int, int, str]] = []  # data ranges of tensors whose size is known, for the overlap check
    for t in h.tensors:
        if t.name in seen:
            add(f"duplicate tensor name '{t.name}'", True)
        seen.add(t.name)
        if len(t.name.encode()) >= GGML_MAX_NAME:
            add(f"tensor name '{t.name}' is {len(t.name.encode())} bytes (llama.cpp allows {GGML_MAX_NAME - 1})", False)
        if len(t.ne) > GGML_MAX_DIMS:
            add(f"tensor '{t.name}' has {len(t.ne)} dimensions (ggml allows {GGML_MAX_DIMS})", False)
        if any(d < 0 for d in t.ne):
            add(f"tensor '{t.name}' has a negative dimension {t.ne}", True)
            expected = None
            continue
        if not t.known_type:
            add(f"tensor '{t.name}' has unknown tensor type {t.ggml_type}", True)
            expected = None  # its size is unknown, so later offsets cannot be predicted
            continue
        block = GGML_QUANT_SIZES[GGMLQuantizationType(t.ggml_type)][0]
        if t.ne and t.ne[0] % block:
            add(f"tensor '{t.name}' row of {t.ne[0]} is not a multiple of the {type_name(t.ggml_type)} block ({block})", True)
            expected = None
            continue
        nbytes = t.nbytes or 0
        if t.offset % h.alignment:
            add(f"tensor '{t.name}' offset {t.offset} is not aligned to {h.alignment}", False, layout=True)
        elif expected is not None and t.offset != expected:
            out_of_place.append(f"tensor '{t.name}' offset {t.offset:,} is not {expected:,}")
        start = h.data_offset + t.offset
        if start + nbytes > h.file_size:
            add(
                f"tensor '{t.name}' data [{start:,}, {start + nbytes:,}) runs past the end of the file "
                f"({h.file_size:,} bytes): truncated or bad offset",
                True,
            )
        if expected is not None:
            expected = t.offset + pad(nbytes, h.alignment)
        spans.append((t.offset, t.offset + nbytes, t.name))
    reach = (0, 0, "")  # the span reaching furthest so far
    for b0, b1, b in sorted(spans):
        if b0 < reach[1] and b1 > b0:  # an empty tensor overlaps nothing
            add(f"tensor '{b}' data [{b0:,}, {b1:,}) overlaps tensor '{reach[2]}' [{reach[0]:,}, {reach[1]:,})",
                False, layout=True)
            break  # one is enough to refuse the file; a shifted offset would otherwise report every neighbour
        if b1 > reach[1]:
            reach = (b0, b1, b)
    if out_of_place:
        more = f" (and {len(out_of_place) - 1} more)" if len(out_of_place) > 1 else ""
        add(f"{out_of_place[0]}{more}: llama.cpp needs tensors packed in order", False)
    return out

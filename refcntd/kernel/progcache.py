"""Compiled BPF programs kept on disk, so an attach does not wait for bcc's compile.

bcc compiles bpf/refcntd.c with clang at every start: 2-4 s here, most of an
attach.  What the compile produces is the programs' instructions, which refer
to maps only through the map fds bcc created (ld_imm64 with
BPF_PSEUDO_MAP_FD).  An entry keeps each program's instructions with those
references replaced by map names; a warm start compiles only the map
declarations (`maps_only`, ~0.2 s: bcc still creates the maps and gives
their key and value types to Python), puts the new fds back in and loads the
programs.  The kernel's verifier checks every loaded program as always.

Keyed by the program text, the compile flags, the bcc library and the
kernel headers: any change compiles again.  An entry carries a digest of its
contents and is ignored when it does not match, or names a map the maps-only
compile did not create: never trusted blindly.

The maps themselves are described by a `Layout` beside the entry (type, key
and value sizes, entries and flags of each, as the kernel reported them for
bcc's maps, with the sizing flags they were made with): with both, a start
creates the maps and loads the programs without bcc (kernel/bpfsys.py).
Other sizes (`--max-objects`, more probe slots) are derived from the maps'
declarations where each size is one macro; where that cannot be done, or a
layout is missing or does not fit the ABI's types, one maps-only compile
records it again.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from refcntd.inputs import rootpaths
from refcntd.paths import write_cache_json

FORMAT = 2  # 2: a layout per option set, maps created without bcc
KEEP = 64  # entries kept; the oldest go first (each is a few hundred KiB)

_LD_IMM64 = 0x18
_PSEUDO_MAP_FD = 1
_INSN = struct.Struct("<BBhi")

_FUNCTION_START = re.compile(r"^(static\b|int\b|TRACEPOINT_PROBE\(|RAW_TRACEPOINT_PROBE\()")


def maps_only(text: str) -> str:
    """The program without its function definitions: structs, maps and preprocessor lines.

    Relies on bpf/'s layout: every function (and prototype) starts at column 0
    with `static`, `int` or TRACEPOINT_PROBE( and ends where its braces balance.  A layout it
    gets wrong makes the maps-only compile fail or miss a map, and the full
    compile runs: slower, never wrong.
    """
    out: list[str] = []
    inside, opened, depth = False, False, 0
    for line in text.splitlines():
        if not inside and _FUNCTION_START.match(line):
            if line.rstrip().endswith(");"):  # a prototype: its definition is cut too
                continue
            if not line.rstrip().endswith(";"):
                inside, opened, depth = True, False, 0
        if inside:
            depth += line.count("{") - line.count("}")
            opened = opened or "{" in line
            inside = not (opened and depth == 0)
            continue
        out.append(line)
    return "\n".join(out) + "\n" + _BTF_ANCHOR


# bcc gives the maps BTF (bpftool shows their fields) only for a program with a function.
_BTF_ANCHOR = "int refcntd_maps_only(void *ctx) { return 0; }\n"


def entry_key(text: str, cflags: list[str], toolchain: dict[str, str]) -> str:
    """What the instructions depend on: source, flags, bcc and the kernel headers.

    A flag that only sizes maps (MAX_OBJECTS, the probe slots, ...) is left
    out: the instructions do not contain map sizes, so `--max-objects` or a
    plan with more probes than guessed reuses the entry (the maps-only
    compile gets every flag)."""
    kept = [flag for flag in cflags if not sizes_maps_only(text, flag)]
    payload = json.dumps({"format": FORMAT, "text": text, "cflags": kept,
                          "toolchain": toolchain}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_WORD = re.compile(r"\b[A-Z_][A-Z0-9_]*\b")
_DEFAULT = re.compile(r"\s*#\s*(ifndef|define)\s+(\w+)")


@functools.lru_cache(maxsize=4)
def _macro_uses(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """(words used in map declarations, words used anywhere else), comments left out;
    a macro's own `#ifndef NAME` / `#define NAME` default counts as neither."""
    in_maps: set[str] = set()
    elsewhere: set[str] = set()
    for line in _COMMENT.sub("", text).splitlines():
        words = set(_WORD.findall(line))
        default = _DEFAULT.match(line)
        if default:
            words.discard(default[2])
        (in_maps if line.startswith("BPF_") else elsewhere).update(words)
    return frozenset(in_maps), frozenset(elsewhere)


def sizes_maps_only(text: str, flag: str) -> bool:
    """-DNAME=... whose NAME appears, outside comments, only in map declarations
    (and its own `#ifndef NAME` / `#define NAME` default)."""
    match = re.fullmatch(r"-D(\w+)(=.*)?", flag)
    if match is None:
        return False
    in_maps, elsewhere = _macro_uses(text)
    return match[1] in in_maps and match[1] not in elsewhere


def file_identity(path: str | Path) -> str:
    """A file as a key part: its real path, size and mtime (a package upgrade changes them)."""
    try:
        real = rootpaths.resolve(path)
        st = os.stat(real)
    except OSError:
        return f"{path}: missing"
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


class Unrelocatable(ValueError):
    """The instructions refer to something other than a map by fd: not cacheable."""


@dataclass(frozen=True)
class Function:
    code: bytes  # map references zeroed
    relocs: tuple[tuple[int, str], ...]  # (instruction index, map name)

    def relocated(self, fds: dict[str, int]) -> bytes:
        """The instructions with these map fds; KeyError if a map is missing."""
        code = bytearray(self.code)
        for index, name in self.relocs:
            op, regs, off, _ = _INSN.unpack_from(code, index * 8)
            _INSN.pack_into(code, index * 8, op, regs, off, fds[name])
        return bytes(code)


def capture(code: bytes, names_by_fd: dict[int, str]) -> Function:
    """One compiled program's instructions with its map fds turned into names."""
    out, relocs = bytearray(code), []
    for index in range(len(code) // 8):
        op, regs, off, imm = _INSN.unpack_from(code, index * 8)
        if op != _LD_IMM64:
            continue
        src = regs >> 4
        if src == 0:
            continue
        if src != _PSEUDO_MAP_FD or imm not in names_by_fd:
            raise Unrelocatable(f"instruction {index}: ld_imm64 src {src} imm {imm}")
        relocs.append((index, names_by_fd[imm]))
        _INSN.pack_into(out, index * 8, op, regs, off, 0)
    return Function(bytes(out), tuple(relocs))


@dataclass(frozen=True)
class Entry:
    key: str
    maps: tuple[str, ...]  # every map the program refers to, by name
    functions: dict[str, Function]


def _body(maps: tuple[str, ...], functions: dict[str, Function]) -> dict[str, object]:
    return {"maps": list(maps),
            "functions": {name: {"code": base64.b64encode(f.code).decode(),
                                 "relocs": [list(r) for r in f.relocs]}
                          for name, f in sorted(functions.items())}}


def _digest(body: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class MapSpec:
    name: str
    map_type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    btf_key: int = 0  # type ids in the layout's BTF (0: none)
    btf_value: int = 0


@dataclass(frozen=True)
class Layout:
    key: str  # the entry's
    maps: tuple[MapSpec, ...]
    sizes: dict[str, str]  # the sizing flags (-DNAME=VALUE) the maps were made with
    btf: bytes = b""  # the compile's BTF (the maps' key and value types), for bpftool


def sizing_flags(text: str, cflags: list[str]) -> dict[str, str]:
    """NAME -> VALUE of the flags entry_key leaves out (they only size maps)."""
    return {m[1]: m[2] for flag in cflags if sizes_maps_only(text, flag)
            for m in [re.fullmatch(r"-D(\w+)=?(.*)", flag)] if m}


def load_layout(cache_dir: Path, key: str) -> Layout | None:
    path = entry_path(cache_dir, key, "layout-")
    try:
        raw = json.loads(path.read_text())
        body = raw["body"]
        if raw.get("format") != FORMAT or raw["key"] != key or raw["digest"] != _digest(body):
            return None
        maps = tuple(MapSpec(str(m[0]), *(int(v) for v in m[1:8])) for m in body["maps"])
        sizes = {str(k): str(v) for k, v in body["sizes"].items()}
        btf = base64.b64decode(body["btf"], validate=True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None
    if not maps or len({m.name for m in maps}) != len(maps):
        return None
    with contextlib.suppress(OSError):
        os.utime(path)
    return Layout(key, maps, sizes, btf)


def store_layout(cache_dir: Path, layout: Layout) -> None:
    body: dict[str, object] = {"maps": [[m.name, m.map_type, m.key_size, m.value_size,
                                         m.max_entries, m.flags, m.btf_key, m.btf_value]
                                        for m in layout.maps],
                               "sizes": layout.sizes,
                               "btf": base64.b64encode(layout.btf).decode()}
    data = {"format": FORMAT, "key": layout.key, "body": body, "digest": _digest(body)}
    path = entry_path(cache_dir, layout.key, "layout-")
    if write_cache_json(path, data):
        prune(path.parent)


def entry_path(cache_dir: Path, key: str, prefix: str = "") -> Path:
    return cache_dir / "bpf" / f"{prefix}{key[:32]}.json"


def load(cache_dir: Path, key: str) -> Entry | None:
    """The entry for `key` if present and intact; None otherwise (compile then)."""
    path = entry_path(cache_dir, key)
    try:
        raw = json.loads(path.read_text())
        body = raw["body"]
        if raw.get("format") != FORMAT or raw["key"] != key or raw["digest"] != _digest(body):
            return None
        functions = {str(name): Function(base64.b64decode(f["code"], validate=True),
                                         tuple((int(i), str(m)) for i, m in f["relocs"]))
                     for name, f in body["functions"].items()}
        maps = tuple(str(m) for m in body["maps"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not functions or any(len(f.code) % 8 or any(m not in maps for _, m in f.relocs)
                            or any(i * 8 >= len(f.code) for i, _ in f.relocs)
                            for f in functions.values()):
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used: kept by prune()
    return Entry(key, maps, functions)


def store(cache_dir: Path, entry: Entry) -> None:
    """Write atomically; a cache that cannot be written only makes the next start slower."""
    body = _body(entry.maps, entry.functions)
    data = {"format": FORMAT, "key": entry.key, "body": body, "digest": _digest(body)}
    path = entry_path(cache_dir, entry.key)
    if write_cache_json(path, data):
        prune(path.parent)


def discard(cache_dir: Path, key: str) -> None:
    """Drop an entry the kernel refused to load (it would be refused again)."""
    with contextlib.suppress(OSError):
        entry_path(cache_dir, key).unlink()


def prune(directory: Path, keep: int = KEEP) -> None:
    """Keep the `keep` most recently used files: an entry and a layout per version of bpf/,
    bcc and the kernel headers (checkouts and wheels of refcntd side by side each make one)."""
    with contextlib.suppress(OSError):
        entries = sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        for old in entries[:-keep] if len(entries) > keep else []:
            old.unlink()

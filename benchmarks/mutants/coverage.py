"""Which source call sites the workload executes, measured on the unmutated build.

Every `call`/`jmp` instruction in the built binaries whose target is one of
the API's functions (or what they inline to, e.g. the stubs) is located in
the source by addr2line's inline chain; the innermost frame of that chain
that is a known site (same file and line, same role) is the site the
instruction belongs to.  One ftrace uprobe per instruction (a `call rel32`
is emulated by the kernel, so cheap) counts how often the workload ran it.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import tracefs
from elftools.elf.elffile import ELFFile
from sites import Site

INSN = re.compile(r"^\s*([0-9a-f]+):\s+(?:call|jmp)\s+[0-9a-f]+ <([^>+]+)>")
CHAIN = re.compile(r"(?:\(inlined by\) )?(\S+) at (\S+):(\d+)")
SUFFIX = re.compile(r"(\.(part|isra|constprop|cold|lto_priv)(\.\d+)?)+$|@plt$")


@dataclass(frozen=True)
class CallInsn:
    binary: str
    vaddr: int
    offset: int  # file offset, for the uprobe
    target: str  # the callee, without .part.N / @plt
    chain: tuple[tuple[str, str, int], ...]  # (function, file, line), innermost first


def file_offset(elf: ELFFile, vaddr: int) -> int:
    for seg in elf.iter_segments():
        start = seg["p_vaddr"]
        if seg["p_type"] == "PT_LOAD" and start <= vaddr < start + seg["p_filesz"]:
            return int(vaddr - start + seg["p_offset"])
    raise ValueError(f"{vaddr:#x} is in no PT_LOAD segment")


def symbol_offsets(path: Path, names: Sequence[str]) -> dict[str, int]:
    """File offsets of the named functions (first definition found)."""
    out: dict[str, int] = {}
    with path.open("rb") as f:
        elf = ELFFile(f)
        for secname in (".symtab", ".dynsym"):
            sec = elf.get_section_by_name(secname)
            if sec is None:
                continue
            for sym in sec.iter_symbols():  # type: ignore[attr-defined]
                if sym.name in names and sym.name not in out and sym["st_value"]:
                    out[sym.name] = file_offset(elf, sym["st_value"])
    return out


def call_insns(binary: Path, targets: frozenset[str]) -> list[CallInsn]:
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(binary)],
                         capture_output=True, text=True, check=True).stdout
    found = [(int(m.group(1), 16), SUFFIX.sub("", m.group(2)))
             for m in map(INSN.match, dis.splitlines()) if m]
    found = [(a, t) for a, t in found if t in targets]
    if not found:
        return []
    chains = _chains(binary, [a for a, _ in found])
    with binary.open("rb") as f:
        elf = ELFFile(f)
        return [CallInsn(str(binary), a, file_offset(elf, a), t, chains.get(a, ()))
                for a, t in found]


def _chains(binary: Path, addrs: list[int]) -> dict[int, tuple[tuple[str, str, int], ...]]:
    text = subprocess.run(["addr2line", "-i", "-p", "-f", "-a", "-e", str(binary)],
                          input="\n".join(hex(a) for a in addrs), capture_output=True,
                          text=True, check=True).stdout
    out: dict[int, list[tuple[str, str, int]]] = {}
    current = -1
    for line in text.splitlines():
        if not line.startswith(" "):
            addr, _, line = line.partition(": ")
            current = int(addr, 16)
            out[current] = []
        m = CHAIN.search(line)
        if m:
            out[current].append((m.group(1), m.group(2), int(m.group(3))))
    return {a: tuple(c) for a, c in out.items()}


def site_of(insn: CallInsn, by_line: dict[tuple[str, int], list[Site]], root: Path,
            family: dict[str, str], role_of: dict[str, str]) -> list[Site]:
    """The source sites this instruction is (the innermost chain frame that is one)."""
    role = family.get(insn.target, "")
    for _, path, line in insn.chain:
        rel = _relative(path, root)
        found = [s for s in by_line.get((rel, line), []) if role_of[s.name] == role]
        if found:
            return found
    return []


def _relative(path: str, root: Path) -> str:
    p = Path(path)
    try:
        return str(p.resolve().relative_to(root.resolve())) if p.is_absolute() else path
    except ValueError:
        return path


def measure(cmds: Sequence[tuple[Sequence[str], dict[str, str]]], insns: list[CallInsn]
            ) -> dict[int, int]:
    """Hits per instruction index, summed over the commands (each run once)."""
    probes = [tracefs.Probe(f"c{i}", i_.binary, i_.offset) for i, i_ in enumerate(insns)]
    total: dict[int, int] = {}
    for cmd, env in cmds:
        traced = tracefs.run(cmd, probes, record=False, env=env)
        for name, n in traced.hits.items():
            total[int(name[1:])] = total.get(int(name[1:]), 0) + n
    return total

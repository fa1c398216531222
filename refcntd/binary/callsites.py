"""Find every place a module transfers control into a function, or prove we cannot.

Why: a uprobe on a stub whose entry the kernel cannot emulate (at -O2 the
stubs begin with `lock add`) is single-stepped on every call.  The kernel
emulates `call rel32` and `jmp rel32/rel8`, and at a call the arguments are
already in their registers, so probing the callers' call instructions costs
an emulated trap instead.  That is only correct when *every* way into the
function is a probed site: this module also collects everything that could
bypass them (address-taken uses, dynamic exports, conditional tail jumps,
code it cannot decode) as `blockers`, and the planner keeps the entry probe
when there is any.

The sweep is linear, per function: symbol and .eh_frame FDE ranges give the
starts (gcc puts no data in .text on x86-64); bytes outside every known
function are checked for rel32 branches to the target by brute force.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial

import capstone
from elftools.dwarf.callframe import FDE
from elftools.elf.dynamic import DynamicSection
from elftools.elf.relocation import RelocationSection

from refcntd import progress
from refcntd.binary import cpus, ehframe, prefilter
from refcntd.binary.elf import ElfImage
from refcntd.binary.forked import Forked
from refcntd.inputs.files import file_stamp

_RIP_REL = re.compile(r"\[rip ([+-]) (0x[0-9a-f]+|\d+)\]")
_HEX = re.compile(r"(?<![\w\[])(0x[0-9a-f]+)")
SHF_ALLOC, SHF_EXECINSTR = 0x2, 0x4
# Read for what they mean (relocations), not scanned as raw pointers.
_SEMANTIC_SECTIONS = ("SHT_RELA", "SHT_REL", "SHT_DYNSYM", "SHT_SYMTAB", "SHT_GNU_HASH",
                      "SHT_HASH", "SHT_NOBITS")
R_X86_64_JUMP_SLOT = 7
KIND_CALL = "call"
KIND_JMP = "jmp"  # tail jump: the return address on the stack is the caller's


@dataclass(frozen=True)
class Site:
    """A direct branch into the target, at an instruction boundary."""

    vaddr: int
    length: int
    kind: str  # KIND_CALL or KIND_JMP
    caller: str  # the function containing it ('' when unnamed)
    after: int  # where a call returns to (vaddr + length)
    after_exclusive: bool  # nothing but this call's return can reach `after`
    cond: int = 0  # a conditional tail jump: 0x10 | its x86 condition code


@dataclass
class TargetScan:
    """What one module does with one target address."""

    target: int
    sites: list[Site] = field(default_factory=list)
    blockers: list[str] = field(default_factory=list)  # why `sites` may not be all


@dataclass
class _Function:
    start: int
    size: int
    name: str


@dataclass(frozen=True)
class Decoded:
    """What the sweep needs of one decoded function."""

    end: int  # after the last decoded instruction (short of the function: undecodable bytes)
    indirect: bool  # an indirect jmp: a jump table may reach any address in it
    branch_targets: frozenset[int]  # of its direct branches (at least where `rows` is not empty)
    rows: list[tuple[int, int, str, str]]  # (address, size, mnemonic, operands) to classify


def _decode_one(md: capstone.Cs, image: ElfImage, fn: _Function) -> Decoded:
    """Every instruction read from Python; rows: those whose operands hold a number."""
    end, targets, indirect = fn.start, set(), False
    rows: list[tuple[int, int, str, str]] = []
    for addr, size, mnem, ops in md.disasm_lite(image.code_at(fn.start, fn.size), fn.start):
        end = addr + size
        indirect |= mnem.endswith("jmp") and not ops.startswith("0x")
        if "0x" not in ops and "rip" not in ops:
            continue  # no address in it: most instructions (the sweep's hot path)
        rows.append((addr, size, mnem, ops))
        branch = _branch_target(mnem, ops)
        if branch is not None:
            targets.add(branch)
    return Decoded(end, indirect, frozenset(targets), rows)


class ModuleScan:
    """One sweep of a module's code for a set of target addresses."""

    def __init__(self, image: ElfImage, targets: dict[int, str],
                 plt_slots: frozenset[int] = frozenset()) -> None:
        """`plt_slots`: GOT slots of PLT stubs among `targets` (an importer's `F@plt`):
        their JUMP_SLOT relocations are how the stub reaches F, not a pointer to it."""
        self.image = image
        self.names = targets  # vaddr -> symbol name (for messages)
        self.plt_slots = plt_slots
        self.results = {t: TargetScan(t) for t in targets}
        self._functions = _functions(image)
        self._big = prefilter.code_bytes(image) >= prefilter.MIN_CODE_BYTES
        self._hits = prefilter.hits(image, targets) if self._big else None
        self._sweep()
        self._check_gaps()
        self._check_data()
        self._check_relocations()

    def _sweep(self) -> None:
        """Decode every function (a big module's shares in parallel: forked workers
        return what they found, merged in order: the same lists as one sweep)."""
        clusters = list(self._clusters())
        shares = _shares(clusters, _workers(self._big))
        workers = [Forked(partial(self._swept_apart, share)) for share in shares[1:]]
        self._sweep_clusters(shares[0])  # this process's share meanwhile
        for share, worker in zip(shares[1:], workers, strict=True):
            found = worker.result()
            if found is None:  # the worker failed: its share is swept here
                self._sweep_clusters(share)
                continue
            for target, (sites, blockers) in found.items():
                self.results[target].sites += sites
                self.results[target].blockers += blockers

    def _swept_apart(self, share: list[list[_Function]]
                     ) -> dict[int, tuple[list[Site], list[str]]]:
        """In a worker: what `share` holds, per target."""
        self.results = {t: TargetScan(t) for t in self.results}
        self._sweep_clusters(share)
        return {t: (r.sites, r.blockers) for t, r in self.results.items()
                if r.sites or r.blockers}

    def _sweep_clusters(self, clusters: Iterable[list[_Function]]) -> None:
        """Overlapping ranges (a symbol and its FDE, an alias) must agree on a site, or
        a mis-started decode could put a probe mid-instruction."""
        clusters = list(clusters)
        decoded = self._decode([fn for cluster in clusters for fn in cluster])
        for done, cluster in enumerate(clusters):
            if done % PROGRESS_EVERY == 0:  # a big module's sweep takes seconds: show it moving
                progress.advance(done, len(clusters))
            reports: dict[int, list[tuple[Site, TargetScan]]] = {}
            for fn in cluster:
                for site, scan in self._sweep_function(fn, next(decoded)):
                    reports.setdefault(site.vaddr, []).append((site, scan))
            for addr, got in sorted(reports.items()):
                covering = [f for f in cluster if f.start <= addr < f.start + f.size]
                site, scan = got[0]
                if len(got) != len(covering):
                    scan.blockers.append(f"function ranges disagree about the instruction at "
                                         f"0x{addr:x}: it may not be an instruction boundary")
                    continue
                named = next((s.caller for s, _ in got if s.caller), "")
                exclusive = all(s.after_exclusive for s, _ in got)
                scan.sites.append(Site(addr, site.length, site.kind, named, site.after,
                                       exclusive, site.cond))

    def _clusters(self) -> Iterable[list[_Function]]:
        """Every group of overlapping functions; in a big module only those a byte-level
        test (prefilter.py) says may name a target: the same sites and blockers."""
        clusters = _overlapping(self._functions)
        if self._hits is None:
            return clusters
        clusters = list(clusters)
        spans = [(c[0].start, max(f.start + f.size for f in c)) for c in clusters]
        keep = prefilter.candidates(spans, self._hits, self.results)
        return (c for i, c in enumerate(clusters) if i in keep)

    def _decode(self, functions: list[_Function]) -> Iterator[Decoded]:
        """Each function's Decoded, in order: a big module's in numpy batches
        (batchdecode.py), a small one's an instruction at a time."""
        md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        if self._hits is None:
            return (_decode_one(md, self.image, fn) for fn in functions)
        from refcntd.binary.batchdecode import BatchDecoder
        batch = BatchDecoder(md, self.image, self._hits, self.results)
        return batch.decode((fn.start, fn.size) for fn in functions)

    def _sweep_function(self, fn: _Function, decoded: Decoded) -> list[tuple[Site, TargetScan]]:
        found: list[tuple[int, int, str, TargetScan]] = []
        for addr, size, mnem, ops in decoded.rows:
            self._classify(fn, addr, size, mnem, ops, _branch_target(mnem, ops), found)
        if decoded.end < fn.start + fn.size:
            self._brute_force(decoded.end, fn.start + fn.size,
                              f"undecodable bytes in {fn.name or hex(fn.start)}")
        return [(Site(addr, size, KIND_CALL if mnem == "call" else KIND_JMP, fn.name,
                      addr + size,
                      not decoded.indirect and addr + size not in decoded.branch_targets,
                      _condition(self.image.code_at(addr, 2)) or 0), scan)
                for addr, size, mnem, scan in found]

    def _classify(self, fn: _Function, addr: int, size: int, mnem: str, ops: str,
                  branch: int | None, found: list[tuple[int, int, str, TargetScan]]) -> None:
        if branch is not None:  # a direct branch takes no address: only its target matters
            if branch in self.results:
                scan = self.results[branch]
                first = self.image.code_at(addr, 2)
                if mnem in ("call", "jmp") or _condition(first) is not None:
                    found.append((addr, size, mnem, scan))
                else:
                    scan.blockers.append(f"prefixed branch at {_where(fn, addr, mnem, ops)}: "
                                         "the kernel does not emulate it")
            return
        for ref in _operand_addresses(addr, size, ops):
            if ref in self.results:
                self.results[ref].blockers.append(
                    f"address taken at {_where(fn, addr, mnem, ops)}: it can be called "
                    "through a pointer")

    def _check_gaps(self) -> None:
        """Executable bytes no known function covers: brute-force rel32 branches."""
        covered = sorted((f.start, f.start + f.size) for f in self._functions)
        for section in self.image.sections:
            if not section["sh_flags"] & SHF_EXECINSTR or section["sh_type"] == "SHT_NOBITS":
                continue
            pos, end = section["sh_addr"], section["sh_addr"] + section["sh_size"]
            for start, stop in [*covered, (end, end)]:
                if pos < min(start, end):
                    self._brute_force(pos, min(start, end), f"code in {section.name} outside "
                                      "any known function")
                pos = max(pos, stop)

    def _brute_force(self, start: int, end: int, what: str) -> None:
        """Any byte pattern that would branch to a target if it were an instruction."""
        code = self.image.code_at(start, end - start)
        for i in range(len(code) - 1):
            for target in _branch_patterns(code, i, start + i):
                if target in self.results:
                    self.results[target].blockers.append(
                        f"bytes at 0x{start + i:x} ({what}) may be a branch to it")

    def _check_data(self) -> None:
        """A function pointer in a table or variable: the address stored in data."""
        for section in self.image.sections:
            flags = section["sh_flags"]
            if not flags & SHF_ALLOC or flags & SHF_EXECINSTR or \
                    section["sh_type"] in _SEMANTIC_SECTIONS:
                continue
            blob = section.data()
            for target, scan in self.results.items():
                for hit in _find_all(blob, target.to_bytes(8, "little")):
                    scan.blockers.append(f"address stored in data at 0x{section['sh_addr'] + hit:x}"
                                         f" ({section.name}: a function-pointer table or variable)")

    def _check_relocations(self) -> None:
        """Relocations that produce the address at load time (PIE tables, GOT slots)."""
        by_name: dict[str, list[int]] = {}
        for target, name in self.names.items():
            by_name.setdefault(name, []).append(target)
        for section in self.image.sections:
            if section["sh_type"] not in ("SHT_RELA", "SHT_REL") or \
                    not section.name.startswith((".rela.dyn", ".rela.plt", ".rel.")):
                continue
            for offset, rtype, name, value in self.image.relocations(section):
                if rtype == R_X86_64_JUMP_SLOT and offset in self.plt_slots:
                    continue
                matched = set(by_name.get(name, ())) if name else set()
                if value in self.results:
                    matched.add(value)
                for target in matched:  # each target's list keeps the relocations' order
                    self.results[target].blockers.append(
                        f"relocation at 0x{offset:x} yields its address"
                        f" ({'symbol ' + name if name else 'relative'}): reached "
                        "through a pointer, GOT or PLT slot")


MAX_WORKERS = 4
PROGRESS_EVERY = 512  # clusters swept between progress updates


def _workers(big: bool) -> int:
    """Sweep workers: for a module worth a fork, one per CPU we may run on and our own
    background work does not keep busy."""
    return max(1, min(MAX_WORKERS, cpus.free())) if big else 1


def _shares(clusters: list[list[_Function]], n: int) -> list[list[list[_Function]]]:
    """`clusters` cut in `n` consecutive runs of about the same code size."""
    if n <= 1 or len(clusters) < 2 * n:
        return [clusters]
    sizes = [max(f.start + f.size for f in c) - c[0].start for c in clusters]
    shares: list[list[list[_Function]]] = []
    each, run, acc = sum(sizes) / n, [], 0
    for cluster, size in zip(clusters, sizes, strict=True):
        run.append(cluster)
        acc += size
        if acc >= each * (len(shares) + 1) and len(shares) < n - 1:
            shares.append(run)
            run = []
    return [*shares, run] if run else shares


def _where(fn: _Function, addr: int, mnem: str, ops: str) -> str:
    return f"{fn.name or '?'}+0x{addr - fn.start:x} (0x{addr:x}: {mnem} {ops})"


def _functions(image: ElfImage) -> list[_Function]:
    """Distinct code ranges from .symtab/.dynsym and .eh_frame."""
    ranges: dict[tuple[int, int], str] = {}
    for group in image.symbols.values():
        for sym in group:
            if sym.size:
                ranges.setdefault((sym.vaddr, sym.size), sym.name)
    for start, size in fde_ranges(image):
        ranges.setdefault((start, size), "")
    names = {start: name for (start, _), name in ranges.items() if name}
    return [_Function(start, size, name or names.get(start, ""))
            for (start, size), name in sorted(ranges.items())]


def _overlapping(functions: list[_Function]) -> Iterable[list[_Function]]:
    """Functions (sorted by start) grouped where their ranges overlap."""
    cluster: list[_Function] = []
    end = -1
    for fn in functions:
        if cluster and fn.start >= end:
            yield cluster
            cluster = []
        cluster.append(fn)
        end = max(end, fn.start + fn.size) if len(cluster) > 1 else fn.start + fn.size
    if cluster:
        yield cluster


def fde_ranges(image: ElfImage) -> list[tuple[int, int]]:
    fast = ehframe.fde_ranges(image)
    return fast if fast is not None else slow_fde_ranges(image)


def slow_fde_ranges(image: ElfImage) -> list[tuple[int, int]]:
    """pyelftools' full parse (every FDE's instructions): for encodings ehframe.py lacks."""
    elf = image.elffile()
    if elf.get_section_by_name(".eh_frame") is None:
        return []
    return [(e.header["initial_location"], e.header["address_range"])
            for e in elf.get_dwarf_info().EH_CFI_entries() if isinstance(e, FDE)]


def _branch_target(mnem: str, ops: str) -> int | None:
    """The target of a direct call/jmp/jcc (capstone prints it as a bare hex number)."""
    if mnem.split()[-1] in ("call", "jmp") or mnem.split()[-1].startswith("j"):
        if ops.startswith("0x") and " " not in ops:
            return int(ops, 16)
    return None


def _operand_addresses(addr: int, size: int, ops: str) -> Iterable[int]:
    for sign, value in _RIP_REL.findall(ops):
        disp = int(value, 0)
        yield addr + size + (disp if sign == "+" else -disp)
    for value in _HEX.findall(_RIP_REL.sub("", ops)):
        yield int(value, 16)


def _condition(first: bytes) -> int | None:
    """0x10 | cc of an unprefixed jcc (the BPF side tests it on the flags), else None."""
    if first and 0x70 <= first[0] <= 0x7F:
        return 0x10 | (first[0] & 0xF)
    if len(first) == 2 and first[0] == 0x0F and 0x80 <= first[1] <= 0x8F:
        return 0x10 | (first[1] & 0xF)
    return None


def _branch_patterns(code: bytes, i: int, addr: int) -> Iterable[int]:
    """Targets of call/jmp rel32, jcc rel32, jmp/jcc rel8 if an instruction began at code[i]."""
    op = code[i]
    if op in (0xE8, 0xE9) and i + 5 <= len(code):
        yield addr + 5 + int.from_bytes(code[i + 1:i + 5], "little", signed=True)
    if op == 0x0F and 0x80 <= code[i + 1] <= 0x8F and i + 6 <= len(code):
        yield addr + 6 + int.from_bytes(code[i + 2:i + 6], "little", signed=True)
    if op == 0xEB or 0x70 <= op <= 0x7F:
        yield addr + 2 + int.from_bytes(code[i + 1:i + 2], "little", signed=True)


def _find_all(blob: bytes, needle: bytes) -> Iterable[int]:
    i = blob.find(needle)
    while i >= 0:
        yield i
        i = blob.find(needle, i + 1)


STB_LOCAL, STV_DEFAULT, STV_PROTECTED = 0, 0, 3


def dynamic_export(image: ElfImage, name: str) -> bool:
    """Whether other modules can bind to `name` (PLT imports, dlsym, later dlopens)."""
    return any(sym.shndx != 0 and sym.info >> 4 != STB_LOCAL and
               sym.other & 3 in (STV_DEFAULT, STV_PROTECTED)
               for sym in image.dynamic_symbols_named(name))


def needed(image: ElfImage) -> list[str]:
    """DT_NEEDED sonames: the modules loaded with this one, the likely importers."""
    dynamic = image.elffile().get_section_by_name(".dynamic")
    if not isinstance(dynamic, DynamicSection):
        return []
    return [str(getattr(tag, "needed")) for tag in dynamic.iter_tags()  # noqa: B009 - set per tag kind
            if tag.entry.d_tag == "DT_NEEDED"]


def imports(image: ElfImage, name: str) -> bool:
    """Whether the module binds to `name` from another one (an undefined .dynsym entry)."""
    return any(sym.shndx == 0 for sym in image.dynamic_symbols_named(name))


_PLT_STUBS: dict[str, tuple[object, dict[str, list[tuple[int, int]]]]] = {}  # path -> last
_STUB_NAMES: dict[str, tuple[object, dict[int, str]]] = {}  # path -> (plt_stubs', inverse)


def plt_stubs(image: ElfImage) -> dict[str, list[tuple[int, int]]]:
    """Imported function name -> [(PLT stub address, its GOT slot)]; read once per
    version of the file (the plan asks for each role, and for the module itself and
    its importers; `serve` outlives files replaced in place).

    A call from this module to another module's F is `call F@plt`, and the
    stub jumps through the GOT slot ld.so fills with F's address: probing the
    calls to the stub is probing the calls to F.  Found from the JUMP_SLOT
    relocations and the stubs' `jmp [rip + slot]` in .plt, .plt.sec, .plt.got.
    """
    stamp = file_stamp(image.path)
    if stamp is None:
        return _read_plt_stubs(image)
    version = (image.build_id, stamp)
    kept = _PLT_STUBS.get(str(image.path))
    if kept is None or kept[0] != version:
        kept = (version, _read_plt_stubs(image))
        _PLT_STUBS[str(image.path)] = kept
    return kept[1]


def plt_stub_names(image: ElfImage) -> dict[int, str]:
    """PLT stub address -> the imported function it jumps to: what `call X@plt`
    calls (the inverse of plt_stubs, made once per version it has)."""
    stubs = plt_stubs(image)
    kept = _STUB_NAMES.get(str(image.path))
    if kept is None or kept[0] is not stubs:
        kept = (stubs, {start: name for name, rows in stubs.items() for start, _ in rows})
        _STUB_NAMES[str(image.path)] = kept
    return kept[1]


def _read_plt_stubs(image: ElfImage) -> dict[str, list[tuple[int, int]]]:
    elf = image.elffile()
    slot_names = {offset: name.split("@", 1)[0] for offset, rtype, name, _ in _rela(image)
                  if rtype == R_X86_64_JUMP_SLOT and name}
    out: dict[str, list[tuple[int, int]]] = {}
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    for section_name in (".plt", ".plt.sec", ".plt.got"):
        plt = elf.get_section_by_name(section_name)
        if plt is None or plt["sh_type"] == "SHT_NOBITS":
            continue
        previous: tuple[int, str] = (-1, "")
        for addr, size, mnem, ops in md.disasm_lite(plt.data(), plt["sh_addr"]):
            if mnem.endswith("jmp") and "[rip" in ops:
                slot = next(iter(_operand_addresses(addr, size, ops)), None)
                if slot in slot_names:
                    start = previous[0] if previous[1] == "endbr64" else addr
                    out.setdefault(slot_names[slot], []).append((start, slot))
            previous = (addr, mnem)
    return out


def address_imports(image: ElfImage, name: str) -> list[str]:
    """Relocations that put the address of the imported `name` in memory (GLOB_DAT:
    a function pointer or a -fno-plt call through the GOT; R_X86_64_64: a table)."""
    return [f"relocation at 0x{offset:x} puts its address in memory (a function pointer, "
            "or a call through the GOT)" for offset, rtype, sym, _ in _rela(image)
            if sym and rtype != R_X86_64_JUMP_SLOT and sym.split("@", 1)[0] == name]


def _rela(image: ElfImage) -> Iterator[tuple[int, int, str, int]]:
    """The relocations of every .rela* section (ElfImage.relocations' rows)."""
    for section in image.sections:
        if isinstance(section, RelocationSection) and section.name.startswith(".rela"):
            yield from image.relocations(section)

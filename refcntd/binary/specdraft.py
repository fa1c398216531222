"""Propose a refcount spec from a library's exported symbols and SDT notes.

Naming conventions carry most refcount APIs: FOO_ref/FOO_unref,
FOO_up_ref/FOO_free, FOO_retain/FOO_release, FOO_reference/FOO_destroy,
FooRef/FooFree, and USDT probes such as libvirt's object_new/object_ref/
object_unref/object_dispose.  What naming cannot tell (argument positions of
odd constructors, whether a delete fires inside the last put, objects the
library keeps) is left to the user: the result is a draft, refused by every
command but `check` until its `draft: true` line is deleted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import capstone
from elftools.elf.relocation import RelocationSection
from elftools.elf.sections import SymbolTableSection

from refcntd.binary.elf import ElfImage
from refcntd.binary.sdt import SdtProbe, sdt_probes
from refcntd.errors import BinaryError
from refcntd.inputs import rootpaths

# (get suffix, put suffixes in order of preference)
PAIRS = (("_up_ref", ("_free",)), ("_ref", ("_unref", "_free", "_release")),
         ("_retain", ("_release",)), ("_reference", ("_destroy", "_unref")),
         ("Ref", ("Free", "Unref", "Release")), ("_get", ("_put",)))
# FOO_new*, FOO_create*, and with a word between (json_array_sized_new); FOO_alloc (the
# allocator its constructors call: json_node_alloc); copies; OpenSSL's and libvirt's forms
CTOR_RE = (r"^(?:{stem}_(?:[a-z0-9]+_)?(?:new|create)\w*|{stem}_(?:alloc|dup|copy)|d2i_{stem}"
           r"|{stem}(?:New|CreateXML|DefineXML|LookupBy)\w*?)(?<!ACL)$")
SDT_VERBS = (("init", re.compile(r"(new|create|alloc|init)$")),
             ("put", re.compile(r"(unref|release|put)$")),
             ("get", re.compile(r"(ref|retain|get)$")),
             ("delete", re.compile(r"(dispose|free|destroy|delete|finalize)$")))


@dataclass
class TypeProposal:
    stem: str
    get: str
    put: str
    constructors: list[str] = field(default_factory=list)
    delegating: list[str] = field(default_factory=list)  # constructors that call another


@dataclass
class UsdtProposal:
    provider: str
    stem: str
    probes: dict[str, SdtProbe] = field(default_factory=dict)  # role -> probe


@dataclass
class Draft:
    library: str
    types: list[TypeProposal]
    usdt: list[UsdtProposal]
    unplaced: list[str]


def _another_types(name: str, stem: str, names: set[str]) -> bool:
    """FOO_WORD_new is FOO's constructor (json_array_sized_new) unless FOO_WORD names a
    type of its own, with other functions (g_param_spec_pool_new: g_param_spec_pool_insert,
    _lookup ...)."""
    m = re.match(rf"{re.escape(stem)}_([a-z0-9]+)_(?:new|create)", name)
    if m is None:
        return False
    prefix = f"{stem}_{m.group(1)}_"
    return any(n.startswith(prefix) and not n[len(prefix):].startswith(("new", "create"))
               for n in names)


def propose(path: str) -> Draft:
    image = ElfImage(path)
    names = api_names(image)
    calls = CallGraph(image)
    types, unplaced = [], []
    for stem, get, put in _pairs(names):
        prop = TypeProposal(stem, get, put)
        ctor_re = re.compile(CTOR_RE.format(stem=re.escape(stem)))
        ctors = sorted(n for n in names
                       if ctor_re.match(n) and not _another_types(n, stem, names))
        for ctor in ctors:  # a constructor that hands over to another is covered by it
            (prop.delegating if calls.targets(ctor) & (set(ctors) - {ctor})
             else prop.constructors).append(ctor)
        if not prop.constructors:
            unplaced.append(f"{stem}: {get}/{put} found but no constructor "
                            f"({stem}_new*, {stem}_create*, d2i_{stem} ...): add an init entry")
        types.append(prop)
    usdt = _usdt(image, unplaced)
    return Draft(spec_library(image), types, usdt, unplaced)


def spec_library(image: ElfImage) -> str:
    """What the draft's `library:` says: the name ld.so would find this very file by
    (its soname or file name, as the bundled specs say `libgobject-2.0.so.0`), or else
    its absolute path, so that the spec names the file that was read and no other."""
    from refcntd.binary.libpaths import resolve_library
    path = Path(rootpaths.resolve(image.path))
    for name in dict.fromkeys(n for n in (image.soname(), image.path.name) if n):
        try:
            found = Path(resolve_library(name, None))
        except BinaryError:
            continue
        if Path(rootpaths.resolve(found)) == path:
            return name
    return str(path)


STT_FUNC, STB_LOCAL = 2, 0


def api_names(image: ElfImage) -> set[str]:
    """The functions that make up a module's API: a library's exported functions (its
    defined .dynsym functions, whether or not .symtab lists them too: every unstripped
    developer build has both), or for an executable, which exports none, its global
    .symtab functions (the stubs of perf live there)."""
    exported = {row.name.split("@", 1)[0] for row in image.dynamic_symbols()
                if row.shndx != 0 and row.info & 0xF == STT_FUNC and row.info >> 4 != STB_LOCAL}
    if exported:
        return exported
    return {n for n, syms in image.symbols.items() if any(s.table == ".symtab" for s in syms)}


def _pairs(names: set[str]) -> list[tuple[str, str, str]]:
    found: dict[str, tuple[str, str, str]] = {}
    for name in sorted(names):
        for get_suffix, put_suffixes in PAIRS:
            if not name.endswith(get_suffix) or len(name) == len(get_suffix):
                continue
            stem = name[: -len(get_suffix)]
            put = next((stem + p for p in put_suffixes if stem + p in names), None)
            if put and stem not in found and not stem.endswith(("_un", "_up", "_weak", "Weak")):
                found[stem] = (stem, name, put)
            break
    return list(found.values())


def _usdt(image: ElfImage, unplaced: list[str]) -> list[UsdtProposal]:
    """Groups of SDT probes STEM_VERB per provider that look like an object lifecycle."""
    groups: dict[tuple[str, str], UsdtProposal] = {}
    for probe in sdt_probes(image):
        for role, verb in SDT_VERBS:
            m = verb.search(probe.name)
            if m and m.start() > 0 and probe.name[m.start() - 1] == "_":
                stem = probe.name[: m.start() - 1]
                key = (probe.provider, stem)
                prop = groups.setdefault(key, UsdtProposal(probe.provider, stem))
                prop.probes.setdefault(role, probe)
                break
    out = [g for g in groups.values() if {"get", "put"} <= g.probes.keys()]
    for g in out:
        where = f"usdt {g.provider}:{g.stem}_*"
        if "init" not in g.probes:
            unplaced.append(f"{where}: no creation probe: add an init role")
        elif len(g.probes["init"].args) >= 2:
            unplaced.append(f"{where}: confirm that argument 2 of {g.probes['init'].full_name} "
                            "is the type name (a string)")
        if "delete" in g.probes:
            unplaced.append(f"{where}: does {g.probes['delete'].full_name} fire inside the "
                            "last put, before that put's own probe? then add "
                            "`inside_last_put: before` to the delete role")
    return out


class CallGraph:
    """Direct call/jmp targets of exported functions, PLT stubs resolved to names."""

    def __init__(self, image: ElfImage) -> None:
        self.image = image
        self.by_addr = {s.vaddr: n for n, syms in image.symbols.items() for s in syms}
        self.by_addr.update(_plt_stubs(image))
        self.md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)

    def targets(self, name: str) -> set[str]:
        out: set[str] = set()
        for sym in self.image.symbols.get(name, [])[:1]:
            code = self.image.code_at(sym.vaddr, min(sym.size or 64, 8192))
            for insn in self.md.disasm(code, sym.vaddr):
                if insn.mnemonic in ("call", "jmp") and insn.op_str.startswith("0x"):
                    target = self.by_addr.get(int(insn.op_str, 16))
                    if target:
                        out.add(target)
        return out


def _plt_stubs(image: ElfImage) -> dict[int, str]:
    """PLT stub address -> the function it jumps to (via .rela.plt's GOT slots)."""
    elf = image.elffile()
    rela = elf.get_section_by_name(".rela.plt")
    if not isinstance(rela, RelocationSection):
        return {}
    symtab = elf.get_section(rela["sh_link"])
    if not isinstance(symtab, SymbolTableSection):
        return {}
    slots = {r["r_offset"]: symtab.get_symbol(r["r_info_sym"]).name.split("@")[0]
             for r in rela.iter_relocations()}
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    stubs: dict[int, str] = {}
    for sec_name in (".plt.sec", ".plt"):
        sec = elf.get_section_by_name(sec_name)
        if sec is None:
            continue
        for insn in md.disasm(sec.data(), sec["sh_addr"]):
            m = re.match(r"qword ptr \[rip \+ (0x[0-9a-f]+)\]", insn.op_str)
            if insn.mnemonic in ("jmp", "bnd jmp") and m:
                slot = insn.address + insn.size + int(m.group(1), 16)
                if slot in slots:
                    stubs[insn.address & ~0xF] = slots[slot]
    return stubs


def render(draft: Draft, name: str) -> str:
    """The draft as a spec file: `draft: true`, and what could not be placed."""
    lines = [f"# DRAFT proposed by `refcntd spec draft` from {draft.library}:",
             "# names alone cannot prove a role.  Check each entry against the library,",
             "# run `refcntd check --binary PROGRAM --spec THIS_FILE` (it lists what could",
             "# not be placed), then delete the `draft: true` line.",
             "version: 1", f"name: {name}", "draft: true", f"library: {draft.library}"]
    if draft.unplaced:
        lines += ["unplaced:"] + [f"  - {_quote(u)}" for u in draft.unplaced]
    lines.append("roles:")
    lines += _usdt_roles(draft.usdt[0]) if draft.usdt else _function_roles(draft.types)
    if draft.usdt and draft.types:
        lines.append("# also exported (an alternative to the USDT roles, not both):")
        lines += [f"#   {t.stem}: {t.get} / {t.put}" for t in draft.types]
    return "\n".join(lines) + "\n"


def _function_roles(types: list[TypeProposal]) -> list[str]:
    init = [t for t in types if t.constructors]
    lines = ["  init:"]
    for t in init:
        lines += [f"    - functions: [{', '.join(t.constructors)}]",
                  "      object: return", f"      type: {{name: {t.stem}}}"]
        if t.delegating:
            lines.append(f"      # not listed, they hand over to these: {', '.join(t.delegating)}")
    lines.append("  get:")  # only types with a constructor: others are in `unplaced`
    lines += [f"    - {{functions: [{t.get}], object: arg1}}" for t in init]
    lines.append("  put:")
    lines += [f"    - {{functions: [{t.put}], object: arg1}}" for t in init]
    return lines


def _usdt_roles(group: UsdtProposal) -> list[str]:
    lines = []
    for role in ("init", "get", "put", "delete"):
        probe = group.probes.get(role)
        if probe is None:
            continue
        lines += [f"  {role}:", f"    usdt: {probe.full_name}", "    object: arg1"]
        if role == "init":
            lines.append("    type: arg2" if len(probe.args) >= 2 else
                         f"    type: {{name: {group.stem}}}")
    return lines


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

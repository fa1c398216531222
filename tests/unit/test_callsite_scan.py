"""Call-site discovery on real compiled code: every way into a function is a
site or a named blocker (no root needed).  Every test runs on both sweeps: a
small module's (each instruction read from Python) and a big module's
(capstone's records read by numpy, batchdecode.py), forced here on small code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import cc

from refcntd.binary import prefilter
from refcntd.binary.callsites import KIND_CALL, KIND_JMP, ModuleScan, plt_stubs
from refcntd.binary.elf import ElfImage
from refcntd.binary.libpaths import resolve_library
from refcntd.binary.probepoint import Refusal
from refcntd.binary.sitemode import (
    MODE_AUTO,
    MODE_CALLSITES,
    MODE_ENTRY,
    CallSitePlan,
    decide,
    load_set,
    parse_modes,
    plan_call_sites,
    scan_targets,
)

ASM = r"""
#define FN(name, body) __asm__(".text\n.globl " #name "\n.type " #name ",@function\n" \
    #name ":\n" body "\n.size " #name ", .-" #name "\n")
FN(stub, "lock addl $1, (%rdi)\n ret");
FN(ctor, "lock addl $1, (%rdi)\n mov %rdi, %rax\n ret");
FN(plain_call, "push %rbx\n call stub\n pop %rbx\n ret");
FN(tail_jump, "jmp stub");
__asm__(".globl pc_alias\n.type pc_alias,@function\n.set pc_alias, plain_call\n"
        ".size pc_alias, 6\n");  /* an alias of another size: its sites must not double */
FN(cond_tail, "test %rdi, %rdi\n jne stub\n ret");
FN(ctor_caller, "push %rbx\n call ctor\n nop\n pop %rbx\n ret");
FN(ctor_loop, "push %rbx\n call ctor\n1: push %rax\n pop %rax\n test %rax, %rax\n jne 1b\n"
              " pop %rbx\n ret");
FN(ctor_tail, "jmp ctor");
int main(void) { return 0; }
"""


@pytest.fixture(autouse=True, params=["per-instruction", "batch"])
def sweep(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "batch":
        monkeypatch.setattr(prefilter, "MIN_CODE_BYTES", 0)
    return str(request.param)


def scan(tmp_path: Path, source: str, flags: list[str], names: tuple[str, ...] = ("stub",)
         ) -> tuple[ElfImage, ModuleScan]:
    src = tmp_path / "t.c"
    src.write_text(source)
    image = ElfImage(cc(tmp_path / "t", [src], ["-O2", *flags]))
    targets = {image.symbols[n][0].vaddr: n for n in names}
    return image, ModuleScan(image, targets)


def sites_of(image: ElfImage, result: ModuleScan, name: str) -> list[tuple[str, str]]:
    return sorted((s.caller, s.kind) for s in result.results[image.symbols[name][0].vaddr].sites)


def blockers_of(image: ElfImage, result: ModuleScan, name: str) -> str:
    return " | ".join(result.results[image.symbols[name][0].vaddr].blockers)


def test_direct_calls_and_tail_jumps_are_sites(tmp_path):
    image, result = scan(tmp_path, ASM, [], ("stub", "ctor"))
    found = sites_of(image, result, "stub")
    assert [kind for _, kind in found] == [KIND_JMP, KIND_CALL, KIND_JMP], found
    assert found[0][0] == "cond_tail" and found[1][0] in ("plain_call", "pc_alias")
    assert found[2][0] == "tail_jump"
    conds = {s.caller: s.cond for s in result.results[image.symbols["stub"][0].vaddr].sites}
    assert conds["cond_tail"] == 0x15 and conds["tail_jump"] == 0  # jne: cc 5
    assert blockers_of(image, result, "stub") == ""


HOSTILE = ASM.replace("int main(void) { return 0; }", r"""
/* bnd jmp stub, as bytes: binutils 2.44 (Debian 13) no longer assembles `bnd` */
FN(bnd_tail, ".byte 0xf2, 0xe9\n .long stub - . - 4");
FN(near_rel8, "test %rdi, %rdi\n je 1f\n jmp stub\n1: ret");
FN(by_table, "push %rbx\n call stub\n pop %rbx\n jmp *(%rdi)");
FN(garbage, ".byte 0x06\n call stub\n ret");
FN(rip_ref, "lea stub(%rip), %rax\n ret");
int main(void) { return 0; }
""")


def test_hostile_code_gives_sites_and_blockers_on_both_sweeps(tmp_path):
    """A prefixed branch, a rel8 jump, a call in a function with an indirect jump,
    undecodable bytes before a call, a RIP-relative address: each found, each named."""
    image, result = scan(tmp_path, HOSTILE, [])
    sites = {s.caller: s for s in result.results[image.symbols["stub"][0].vaddr].sites}
    assert (sites["near_rel8"].kind, sites["near_rel8"].length) == (KIND_JMP, 2)  # jmp rel8
    assert (sites["cond_tail"].kind, sites["cond_tail"].length) == (KIND_JMP, 2)  # jne rel8
    assert sites["by_table"].kind == KIND_CALL and not sites["by_table"].after_exclusive
    assert sites.get("plain_call", sites.get("pc_alias")).after_exclusive
    assert "bnd_tail" not in sites and "garbage" not in sites
    text = blockers_of(image, result, "stub")
    assert "prefixed branch at bnd_tail+0x0" in text and "bnd jmp" in text
    assert "undecodable bytes in garbage" in text and "may be a branch to it" in text
    assert "address taken at rip_ref+0x0" in text


def test_return_probes_need_an_exclusive_return_point(tmp_path):
    image, result = scan(tmp_path, ASM, [], ("stub", "ctor"))
    ctor = image.symbols["ctor"][0]
    plan = plan_call_sites(image, ctor, result.results, is_return=True, saves_args=True)
    kinds = sorted((p.kind, p.caller) for p in plan.points)
    assert kinds == [("return", "ctor_caller"), ("save", "ctor_caller")]
    text = " | ".join(plan.blockers)
    assert "after the call in ctor_loop" in text and "reached by other jumps" in text
    assert "tail jump from ctor_tail" in text
    assert decide(MODE_CALLSITES, Refusal('lock'), plan)[0] == MODE_ENTRY  # blockers keep the entry


def test_address_taken_in_code_is_a_blocker(tmp_path):
    src = ASM + "void *volatile sink;\nvoid take(void) { extern void stub(void); sink = stub; }\n"
    image, result = scan(tmp_path, src, ["-fPIE", "-pie"])
    assert "address taken at take+" in blockers_of(image, result, "stub")


def test_function_pointer_table_in_data_is_a_blocker(tmp_path):
    src = ASM + "extern void stub(void);\nvoid (*volatile table[])(void) = { stub };\n"
    image, result = scan(tmp_path, src, ["-no-pie", "-fno-pie"])
    assert "address stored in data at" in blockers_of(image, result, "stub")
    image, result = scan(tmp_path, src, ["-fPIE", "-pie"])
    assert "relocation at" in blockers_of(image, result, "stub")


def test_exported_function_without_module_following_keeps_its_entry_probe(tmp_path):
    image, result = scan(tmp_path, ASM, ["-rdynamic"])
    plan = plan_call_sites(image, image.symbols["stub"][0], result.results, False, False)
    assert "exported in .dynsym" in plan.blockers[0]
    mode, why = decide(MODE_CALLSITES, Refusal('lock'), plan)
    assert mode == MODE_ENTRY and "exported in .dynsym" in why


LIB_USER = """
extern void stub(void);
void use_twice(void) { stub(); stub(); }
void use_tail(void) { stub(); }
"""
LIB_POINTER = "extern void stub(void);\nvoid (*volatile keep)(void) = stub;\n"


def exported(tmp_path: Path, user_source: str, flags: tuple[str, ...] = ()
             ) -> tuple[ElfImage, ElfImage]:
    """An executable exporting `stub` (ASM, -rdynamic) linked with libuser.so."""
    lib_src = tmp_path / "user.c"
    lib_src.write_text(user_source)
    lib = ElfImage(cc(tmp_path / "libuser.so", [lib_src],
                      ["-O2", "-fPIC", "-shared", *flags]))
    main_src = tmp_path / "main.c"
    main_src.write_text(ASM.replace("int main(void) { return 0; }",
                                    "void use_twice(void);\n"
                                    "int main(void) { use_twice(); return 0; }"))
    exe = ElfImage(cc(tmp_path / "main", [main_src],
                      ["-O2", "-rdynamic", f"-L{tmp_path}", "-luser",
                       f"-Wl,-rpath,{tmp_path}"]))
    return exe, lib


def exported_plan(exe: ElfImage, lib: ElfImage) -> CallSitePlan:
    stub = exe.symbols["stub"][0]
    targets, slots = scan_targets(exe, ["stub"], lambda _: [])
    scan = ModuleScan(exe, targets, slots).results
    return plan_call_sites(exe, stub, scan, False, False, lambda: [exe, lib])


def test_plt_stubs_of_imported_functions(tmp_path):
    _, lib = exported(tmp_path, LIB_USER)
    ((stub, slot),) = plt_stubs(lib)["stub"]
    assert _jump_slots(lib)[slot] == "stub"
    assert lib.code_at(stub, 1) in (b"\xff", b"\xf3")  # jmp [rip+slot], or endbr64 first


def _jump_slots(image: ElfImage) -> dict[int, str]:
    out = {}
    for section in image.elffile().iter_sections():
        if section.name == ".rela.plt":
            symtab = image.elffile().get_section(section["sh_link"])
            for rel in section.iter_relocations():
                out[rel["r_offset"]] = symtab.get_symbol(rel["r_info_sym"]).name
    return out


def test_exported_function_probed_at_the_plt_calls_of_other_modules(tmp_path):
    exe, lib = exported(tmp_path, LIB_USER)
    plan = exported_plan(exe, lib)
    assert plan.blockers == [], plan.blockers
    where = sorted((Path(p.module).name if p.module else "main", p.caller, p.kind)
                   for p in plan.points)
    assert where[:3] == [("libuser.so", "use_tail", KIND_JMP),
                         ("libuser.so", "use_twice", KIND_CALL),
                         ("libuser.so", "use_twice", KIND_JMP)], where
    assert [w[2] for w in where[3:]] == [KIND_JMP, KIND_CALL, KIND_JMP]  # main's own
    assert plan.importers == [str(lib.path)] and plan.later
    for point in (p for p in plan.points if p.module):  # on the importer's instructions
        code = lib.code_at(point.vaddr, 1)
        assert code in (b"\xe8", b"\xe9"), (point, code)
        assert lib.vaddr_to_offset(point.vaddr) == point.file_offset
    mode, why = decide(MODE_AUTO, Refusal("lock"), plan)
    assert mode == MODE_CALLSITES and "PLT calls from" in why and "dlsym" in why


def test_importer_taking_the_address_is_a_blocker(tmp_path):
    exe, lib = exported(tmp_path, LIB_USER + LIB_POINTER)
    plan = exported_plan(exe, lib)
    assert any(b.startswith(f"{lib.path}: relocation at") and "puts its address" in b
               for b in plan.blockers), plan.blockers
    assert decide(MODE_AUTO, Refusal("lock"), plan)[0] == MODE_ENTRY


def test_an_earlier_definition_is_a_blocker(tmp_path):
    """ld.so binds every import to the first module in its search order that
    defines the name: a library before the traced module takes the calls."""
    exe, lib = exported(tmp_path, "void stub(void) {}\nvoid use_twice(void) {}\n")
    stub_lib = exe  # the traced module, after the interposer in the search order
    targets, slots = scan_targets(stub_lib, ["stub"], lambda _: [])
    scan = ModuleScan(stub_lib, targets, slots).results
    plan = plan_call_sites(stub_lib, stub_lib.symbols["stub"][0], scan, False, False,
                           lambda: [lib, stub_lib])
    assert any(f"{lib.path} also defines stub" in b for b in plan.blockers), plan.blockers


def test_load_set_follows_needed_breadth_first(tmp_path):
    exe, lib = exported(tmp_path, LIB_USER)
    order = [m.path.name for m in load_set(str(exe.path), exe, resolve_library)]
    assert order[:2] == ["main", "libuser.so"], order
    assert "libc.so.6" in order


def test_probe_mode_option():
    assert parse_modes(None) == {"*": "auto"}
    assert parse_modes("callsites") == {"*": "callsites"}
    assert parse_modes("get=callsites,put=entry") == {"*": "auto", "get": "callsites",
                                                      "put": "entry"}
    assert decide(MODE_CALLSITES, Refusal('lock'), CallSitePlan())[0] == MODE_CALLSITES


def test_ldconfig_runs_once_per_version_of_its_cache(tmp_path, monkeypatch):
    """A load set resolves dozens of sonames: `ldconfig -p` runs again only when
    /etc/ld.so.cache changes (a library installed while serve runs)."""
    from refcntd.binary import libpaths as libpaths
    cache = tmp_path / "ld.so.cache"
    cache.write_text("1")
    runs: list[int] = []
    monkeypatch.setattr(libpaths, "LD_SO_CACHE", str(cache))
    monkeypatch.setattr(libpaths, "_run_ldconfig",
                        lambda _cache: runs.append(1) or [f"/lib{len(runs)}"])
    monkeypatch.setattr(libpaths, "_LDCONFIG", {})
    assert libpaths._ldconfig_dirs() == libpaths._ldconfig_dirs() == ["/lib1"]
    os.utime(cache, ns=(1, 10**18))
    assert libpaths._ldconfig_dirs() == ["/lib2"] and len(runs) == 2


def test_load_set_is_read_again_when_a_library_is_replaced(tmp_path):
    """serve re-plans a program: a library upgraded in between (another file at the same
    path) has other call sites, so its load set is read again, not reused."""
    exe, lib = exported(tmp_path, LIB_USER)
    first = {m.path.name: m for m in load_set(str(exe.path), exe, resolve_library)}
    assert load_set(str(exe.path), exe, resolve_library)[1] is first["libuser.so"]  # kept
    src = tmp_path / "user.c"
    src.write_text(LIB_USER + "void use_more(void) { stub(); stub(); stub(); }\n")
    new = tmp_path / "libuser.new.so"
    cc(new, [src], ["-O2", "-fPIC", "-shared", "-Wl,-soname,libuser.so"])
    os.replace(new, lib.path)  # as a package upgrade does: a new inode at the same path
    again = {m.path.name: m for m in load_set(str(exe.path), exe, resolve_library)}
    assert again["libuser.so"] is not first["libuser.so"]
    assert "use_more" in again["libuser.so"].symbols and "use_more" not in lib.symbols

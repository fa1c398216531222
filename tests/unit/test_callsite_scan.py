"""Call-site discovery on real compiled code: every way into a function is a
site or a named blocker (no root needed)."""

from __future__ import annotations

from pathlib import Path

from conftest import cc

from refcntd.binary.callsites import KIND_CALL, KIND_JMP, ModuleScan
from refcntd.binary.elf import ElfImage
from refcntd.binary.probepoint import Refusal
from refcntd.binary.sitemode import (
    MODE_CALLSITES,
    MODE_ENTRY,
    CallSitePlan,
    decide,
    parse_modes,
    plan_call_sites,
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


def test_exported_function_keeps_its_entry_probe(tmp_path):
    image, result = scan(tmp_path, ASM, ["-rdynamic"])
    plan = plan_call_sites(image, image.symbols["stub"][0], result.results, False, False)
    assert "exported in .dynsym" in plan.blockers[0]
    mode, why = decide(MODE_CALLSITES, Refusal('lock'), plan)
    assert mode == MODE_ENTRY and "exported in .dynsym" in why


def test_probe_mode_option():
    assert parse_modes(None) == {"*": "auto"}
    assert parse_modes("callsites") == {"*": "callsites"}
    assert parse_modes("get=callsites,put=entry") == {"*": "auto", "get": "callsites",
                                                      "put": "entry"}
    assert decide(MODE_CALLSITES, Refusal('lock'), CallSitePlan())[0] == MODE_CALLSITES

"""Tail-call frames across the PLT (issue 31 item 5), on Debian's own binaries:
what a `call X@plt` reaches, and when a frame is put back above its caller.

The stubs' names are checked against objdump's `X@plt` labels (binutils reads
the same JUMP_SLOT relocations its own way); /usr/bin/openssl is -z now with a
`.plt` and a `.plt.got`, Debian's python3 (3.11 on 12, 3.13 on 13) lazy-bound,
and a program built here has IBT's `.plt.sec`.  The stack cases use real call
sites of /usr/bin/openssl into libcrypto and libc.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import capstone
import pytest

from refcntd.analysis.tailcalls import INFERRED, with_tail_calls
from refcntd.binary.callsites import plt_stub_names, plt_stubs
from refcntd.binary.elf import ElfImage
from refcntd.symbolize.symbolizer import BuildIdIndex, Frame, Symbolizer

OPENSSL = Path("/usr/bin/openssl")
LIBDIR = Path("/usr/lib/x86_64-linux-gnu")
LIBCRYPTO, LIBC = LIBDIR / "libcrypto.so.3", LIBDIR / "libc.so.6"
PYTHON = Path(os.path.realpath("/usr/bin/python3"))  # Debian's, not the venv's link
pytestmark = pytest.mark.skipif(
    not all(p.exists() for p in (OPENSSL, LIBCRYPTO, LIBC, PYTHON))
    or shutil.which("objdump") is None, reason="Debian's openssl, python3 and binutils")


def objdump_stubs(path: Path, section: str) -> dict[int, str]:
    """objdump's labels of the stubs in `section`: address -> imported name."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-j", section, str(path)],
                         capture_output=True, text=True, check=True).stdout
    return {int(a, 16): n for a, n in re.findall(r"^([0-9a-f]+) <([^@>]+)@plt>:", out, re.M)}


@pytest.fixture(scope="module")
def ibt_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A program whose calls go through `.plt.sec` (IBT, -z now), as built by some
    distributions."""
    root = tmp_path_factory.mktemp("ibt")
    src = root / "p.c"
    src.write_text("#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n"
                   "int main(int c, char **v) { char *p = malloc(c); strcpy(p, v[0]);"
                   " puts(p); free(p); return 0; }\n")
    exe = root / "p"
    subprocess.run(["gcc", "-O2", "-fcf-protection=full", "-Wl,-z,ibtplt", "-Wl,-z,now",
                    "-o", str(exe), str(src)], check=True)
    return exe


@pytest.mark.parametrize("path, section", [
    (OPENSSL, ".plt"), (PYTHON, ".plt"), (None, ".plt.sec")])
def test_stub_names_are_objdumps(path: Path | None, section: str, ibt_program: Path) -> None:
    """Every `.plt`/`.plt.sec` stub objdump names, named the same (hundreds on the real
    binaries); `.plt`'s lazy-binding entries of an IBT layout are no stubs."""
    path = path or ibt_program
    truth = objdump_stubs(path, section)
    assert len(truth) >= (3 if path == ibt_program else 300)
    names = plt_stub_names(ElfImage(path))
    assert {a: names.get(a) for a in truth} == truth
    if section == ".plt.sec":
        assert not set(names) & set(objdump_stubs(path, ".plt"))


def call_sites(image: ElfImage, target: int) -> list[int]:
    """Return addresses of the `call rel32` to `target` in the image's .text."""
    (text,) = [s for s in image.sections if s.name == ".text"]
    code, base = text.data(), text["sh_addr"]
    return [base + m.start() + 5 for m in re.finditer(re.escape(b"\xe8"), code)
            if len(code) >= m.start() + 5 and base + m.start() + 5 + int.from_bytes(
                code[m.start() + 1:m.start() + 5], "little", signed=True) == target]


@pytest.fixture(scope="module")
def sym() -> Symbolizer:
    return Symbolizer(BuildIdIndex())


def caller(sym: Symbolizer, imported: str) -> Frame:
    """openssl's frame at a return address after its first `call imported@plt`."""
    image = ElfImage(OPENSSL)
    ((stub, _), *_) = plt_stubs(image)[imported]
    ret = call_sites(image, stub)[0]
    return sym.frame((str(OPENSSL), ret), "", True)


def export(sym: Symbolizer, lib: Path, name: str, offset: int = 0) -> Frame:
    (s, *_) = ElfImage(lib).symbols[name]
    return Frame(str(lib), s.vaddr + offset, name, offset)


def test_a_plain_call_through_the_plt_gets_no_frame(sym: Symbolizer) -> None:
    ret = caller(sym, "CRYPTO_free")
    frames = (export(sym, LIBCRYPTO, "CRYPTO_free"), ret)
    assert with_tail_calls(frames, sym) == frames


def test_the_imported_function_that_jumped_away_is_put_back(sym: Symbolizer) -> None:
    """`call CRYPTO_free@plt`, and the frame above is another function of libcrypto:
    CRYPTO_free was there and jumped away; it is put back from libcrypto's .dynsym."""
    ret = caller(sym, "CRYPTO_free")
    above = export(sym, LIBCRYPTO, "CRYPTO_malloc", 4)
    (top, inserted, bottom) = with_tail_calls((above, ret), sym)
    assert (top, bottom) == (above, ret)
    assert (inserted.module, inserted.function, inserted.offset, inserted.raw) == \
        (str(LIBCRYPTO), "CRYPTO_free", 0, INFERRED)
    assert inserted.vaddr == ElfImage(LIBCRYPTO).symbols["CRYPTO_free"][0].vaddr


@pytest.mark.parametrize("above", [
    # memcpy is an IFUNC in libc (and a second, older memcpy@GLIBC_2.2.5): a call
    # lands in an implementation of another name, no tail call
    Frame(str(LIBC), 0x1000, "__memmove_avx_unaligned_erms", 0),
    # X is not in the module above (a third module, CRYPTO_free's own `jmp free@plt`)
    Frame(str(LIBC), 0x1000, "free", 0),
])
def test_unsure_targets_through_the_plt_get_no_frame(sym: Symbolizer, above: Frame) -> None:
    imported = "memcpy" if "memmove" in above.function else "CRYPTO_free"
    ret = caller(sym, imported)
    assert with_tail_calls((above, ret), sym) == (above, ret)


def test_a_call_to_code_without_a_symbol_gets_no_frame(sym: Symbolizer) -> None:
    """openssl is stripped: its own functions have no names, so a call to one, with a
    library frame above, cannot say which function jumped away."""
    ret = local_call(ElfImage(OPENSSL))
    frames = (export(sym, LIBCRYPTO, "CRYPTO_free"), sym.frame((str(OPENSSL), ret), "", True))
    assert not frames[1].function
    assert with_tail_calls(frames, sym) == frames


def local_call(image: ElfImage) -> int:
    """The return address of a real `call` to openssl's own code: decoded from an
    instruction boundary (the return of a `call CRYPTO_free@plt`) onwards."""
    plt = image.section_ranges(".plt")
    (text,) = [s for s in image.sections if s.name == ".text"]
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    ((stub, _), *_) = plt_stubs(image)["CRYPTO_free"]
    for start in call_sites(image, stub):
        for addr, size, mnem, ops in md.disasm_lite(image.code_at(start, 400), start):
            if mnem == "call" and ops.startswith("0x") and size == 5:
                target = int(ops, 16)
                if text["sh_addr"] <= target < text["sh_addr"] + text["sh_size"] and \
                        not any(lo <= target < hi for lo, hi in plt):
                    return addr + size
    raise AssertionError("no call to openssl's own code found")

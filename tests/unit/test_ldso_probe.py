"""The ld.so probe on the installed glibc: every place ld.so reaches _dl_debug_state
(the debugger's hook), by `call` (Debian 12's glibc 2.36) or by a tail `jmp`
(Debian 13's 2.41, which has no SDT notes and no such call), as objdump sees them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from refcntd.binary import ldso
from refcntd.binary.elf import ElfImage


def _objdump_sites(path: Path) -> set[int]:
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return {int(a, 16) for a in re.findall(
        r"^\s*([0-9a-f]+):\s+(?:call|jmp)\s+[0-9a-f]+ <_dl_debug_state@@GLIBC_PRIVATE>$",
        out, re.M)}


def test_every_call_or_tail_jump_to_dl_debug_state(tmp_path, monkeypatch):
    monkeypatch.setattr(ldso, "CACHE_DIR", tmp_path)
    exe = ElfImage(Path("/bin/true"))
    probe = ldso.find_ldso_probe(exe)
    assert probe is not None
    image = ElfImage(Path(probe.path))
    truth = _objdump_sites(image.path)
    assert truth  # 6 calls on glibc 2.36, 2 jumps on 2.41
    rdebug = image.data_symbol("_r_debug")
    assert rdebug is not None
    # each site's file offset, and _r_debug's address relative to it (the BPF cookie)
    assert set(probe.sites) == {(image.vaddr_to_offset(a), rdebug - a) for a in truth}
    # the second look comes from the cache, with the same answer
    assert ldso.find_ldso_probe(exe) == probe

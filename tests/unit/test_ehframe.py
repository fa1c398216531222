"""The header-only .eh_frame reader finds exactly the FDEs pyelftools' full parse does."""

from __future__ import annotations

import glob
import subprocess

import pytest
from conftest import EXAMPLES, cc

from refcntd.binary import ehframe
from refcntd.binary.callsites import slow_fde_ranges
from refcntd.binary.elf import ElfImage

SYSTEM = ["/usr/bin/python3", *sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libc.so.6")),
          *sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libstdc++.so.6"))]


@pytest.mark.parametrize("path", SYSTEM)
def test_debian_binaries_as_installed(path):
    image = ElfImage(path)
    fast = ehframe.fde_ranges(image)
    assert fast is not None and len(fast) > 100
    assert fast == slow_fde_ranges(image)


@pytest.mark.parametrize("flags", [["-O2"], ["-O0", "-fno-omit-frame-pointer"],
                                   ["-O2", "-fPIC", "-shared"], ["-O2", "-static"]],
                         ids=["O2", "O0fp", "shared", "static"])
def test_compiled_here(tmp_path, flags):
    out = cc(tmp_path / "prog", [EXAMPLES / "perflike.c", EXAMPLES / "refcnt.c"], flags)
    image = ElfImage(out)
    assert ehframe.fde_ranges(image) == slow_fde_ranges(image)


def test_without_eh_frame(tmp_path):
    out = cc(tmp_path / "prog", [EXAMPLES / "refcnt.c"],
             ["-O2", "-fPIC", "-shared", "-fno-asynchronous-unwind-tables"])
    subprocess.run(["objcopy", "--remove-section=.eh_frame", "--remove-section=.eh_frame_hdr",
                    str(out)], check=True)
    assert ehframe.fde_ranges(ElfImage(out)) == []

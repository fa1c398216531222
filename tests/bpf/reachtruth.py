"""valgrind memcheck as the oracle of leak kinds (tests of refcntd/reach/).

Each object of the fixtures has a malloc block of a size no other block has:
valgrind's "N bytes in 1 blocks are <kind>" lines then name the object.

valgrind translates the code it runs from memory, so a uprobe's int3 there (a
refcntd attached system-wide, probing ld.so) kills it with SIGTRAP: the program
valgrind runs is linked against a private copy of ld.so, whose inode no probe has.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

LINE = re.compile(r"==\d+== ([\d,]+) (?:\(([\d,]+) direct, [\d,]+ indirect\) )?bytes in "
                  r"(\d+) blocks are (still reachable|definitely lost|indirectly lost|"
                  r"possibly lost)")


def private_loader(directory: Path) -> list[str]:
    """Link flags making a program use its own copy of ld.so."""
    copy = directory / "ld-private.so"
    if not copy.exists():
        directory.mkdir(parents=True, exist_ok=True)
        shutil.copy("/lib64/ld-linux-x86-64.so.2", copy)
    return [f"-Wl,--dynamic-linker={copy}"]


def valgrind_kinds(command: list[str], env: dict[str, str] | None = None,
                   timeout: float = 300) -> dict[int, list[str]]:
    """Block size -> the kinds of the blocks of that size valgrind reports."""
    if shutil.which("valgrind") is None:
        pytest.fail("valgrind (Debian's valgrind package) is the oracle of these tests")
    proc = subprocess.run(["valgrind", "--leak-check=full", "--show-leak-kinds=all",
                           "--num-callers=4", *command], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert "HEAP SUMMARY" in proc.stderr, proc.stderr[-3000:]
    out: dict[int, list[str]] = {}
    for m in LINE.finditer(proc.stderr):
        size = int((m.group(2) or m.group(1)).replace(",", ""))
        out.setdefault(size, []).extend([m.group(4)] * int(m.group(3)))
    return out


def lsan_kind(valgrind_kind: str) -> str:
    """valgrind's "possibly lost" is a block reached through an interior pointer, which
    LeakSanitizer and refcntd count as reachable."""
    return "still reachable" if valgrind_kind == "possibly lost" else valgrind_kind


def fixture_objects(stdout: str) -> dict[int, tuple[str, int]]:
    """address -> (name, block size) from the fixture's OBJ lines."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("OBJ "):
            _, name, size, address = line.split()
            out[int(address, 16)] = (name, int(size))
    return out

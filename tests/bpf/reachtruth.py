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


RECORD = re.compile(r"==\d+== [\d,]+ (?:\([\d,]+ direct, [\d,]+ indirect\) )?bytes in "
                    r"([\d,]+) blocks are (still reachable|definitely lost|indirectly lost|"
                    r"possibly lost) in loss record[^\n]*\n((?:==\d+==    (?:at|by)[^\n]*\n)+)")
FRAME = re.compile(r"(?:at|by) 0x([0-9A-F]+): (\S+)")
ALLOCATORS = {"malloc", "calloc", "g_malloc", "g_malloc0", "g_slice_alloc", "g_slice_alloc0"}


def loss_records(text: str) -> list[tuple[str, int, list[tuple[int, str]]]]:
    """valgrind's loss records: (kind, blocks, [(address, function) of each frame])."""
    return [(m.group(2), int(m.group(1).replace(",", "")),
             [(int(a, 16), f) for a, f in FRAME.findall(m.group(3))])
            for m in RECORD.finditer(text)]


def gobject_requests(text: str) -> list[int]:
    """Where g_type_create_instance tells valgrind of a block (a client request): GLib
    does so for an instance of a class with private data, the instance first."""
    return [int(a, 16) for a in re.findall(r"   at 0x([0-9A-F]+): g_type_create_instance ",
                                           text)]


def is_gobject(names: list[str], top: int, requests: list[int]) -> bool:
    """Whether a record's frames (innermost first) are a GObject instance's block:
    allocated under g_type_create_instance by the allocators only, not inside another
    object's init; for a class with private data, GLib's first client request there."""
    if names.count("g_type_create_instance") != 1:  # none, or made inside another's init
        return False
    at = names.index("g_type_create_instance")
    return top == min(requests) if at == 0 else set(names[:at]) <= ALLOCATORS


def valgrind_gobjects(command: list[str], libs: list[str], directory: Path,
                      env: dict[str, str], timeout: float = 600) -> list[str]:
    """The kind of each GObject instance valgrind lists at the exit of `command`, run
    through private copies of ld.so and of `libs` in `directory` (a uprobe's int3 in
    the system's files, which a refcntd elsewhere may have placed, SIGTRAPs it)."""
    if shutil.which("valgrind") is None:
        pytest.fail("valgrind (Debian's valgrind package) is the oracle of these tests")
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / "ld.so").exists():
        shutil.copy("/lib64/ld-linux-x86-64.so.2", directory / "ld.so")
        for name in libs:
            shutil.copy(Path("/usr/lib/x86_64-linux-gnu") / name, directory / name)
    proc = subprocess.run(["valgrind", "--leak-check=full", "--show-leak-kinds=all",
                           "--num-callers=8", str(directory / "ld.so"), *command],
                          env={**env, "LD_LIBRARY_PATH": str(directory)},
                          capture_output=True, text=True, timeout=timeout)
    assert "LEAK SUMMARY" in proc.stderr and "SIGTRAP" not in proc.stderr, \
        proc.stderr[-2000:]
    requests = gobject_requests(proc.stderr)
    return [kind for kind, blocks, frames in loss_records(proc.stderr)
            if is_gobject([f for _, f in frames], frames[0][0], requests)
            for _ in range(blocks)]

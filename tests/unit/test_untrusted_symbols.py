"""Files a traced process names, as the symbolizer opens them (issue 28); no root.

tests/bpf/test_untrusted.py runs the same attacks through `refcntd run` as
root with the attacker running as nobody.
"""

from __future__ import annotations

import os
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from test_input_files import alarm  # noqa: F401 - a fixture: a FIFO waited on fails
from test_symbolize import build_lib, no_finder, split

from refcntd.binary.elf import ElfImage, read_build_id
from refcntd.symbolize.debugfiles import DebugFileFinder
from refcntd.symbolize.modules import ModuleSymbols
from refcntd.symbolize.perfmap import load_perf_map
from refcntd.symbolize.symbolizer import BuildIdIndex, Symbolizer

pytestmark = pytest.mark.usefixtures("alarm")


def set_debuglink(lib: Path, content: bytes) -> None:
    """Replace lib's .gnu_debuglink with `content` (name, NUL, padding, CRC or not)."""
    blob = lib.with_name("debuglink.bin")
    blob.write_bytes(content)
    subprocess.run(["objcopy", "--remove-section", ".gnu_debuglink", "--add-section",
                    f".gnu_debuglink={blob}", str(lib)], check=True)


def debuglink(name: str, debug: Path) -> bytes:
    raw = name.encode() + b"\0"
    raw += b"\0" * (-len(raw) % 4)
    return raw + struct.pack("<I", zlib.crc32(debug.read_bytes()))


def test_debuglink_naming_a_path_is_ignored_with_a_note(tmp_path):
    lib = build_lib(tmp_path)
    debug = split(lib)
    for name in (str(debug), f"../{tmp_path.name}/{debug.name}", ".."):
        set_debuglink(lib, debuglink(name, debug))
        finder = no_finder()
        assert finder.find(ElfImage(lib)) == (None, True)
        assert finder.notes == [f"{lib}: .gnu_debuglink names a path ({name}), not a file "
                                "name: ignored"]
    set_debuglink(lib, debuglink(debug.name, debug))
    assert no_finder().find(ElfImage(lib)) == (str(debug), True)  # a plain name still works


def test_debuglink_without_crc_is_ignored(tmp_path):
    lib = build_lib(tmp_path)
    split(lib)
    set_debuglink(lib, f"{lib.name}.debug".encode() + b"\0")
    finder = no_finder()
    assert finder.find(ElfImage(lib)) == (None, True)
    assert finder.notes == [f"{lib}: .gnu_debuglink without its CRC: ignored"]


def test_debug_file_beside_the_module_is_not_a_link_fifo_or_device(tmp_path):
    lib = build_lib(tmp_path)
    debug = split(lib)
    moved = debug.rename(tmp_path / "elsewhere.debug")
    debug.symlink_to(moved)
    finder = no_finder()
    assert finder.find(ElfImage(lib)) == (None, True)
    assert finder.notes == [f"debug file {debug}: is a symbolic link, not followed: not used"]
    debug.unlink()
    os.mkfifo(debug)
    finder = no_finder()
    assert finder.find(ElfImage(lib)) == (None, True)  # at once: the alarm would fire
    assert finder.notes == [f"debug file {debug}: is a FIFO, not a regular file: not used"]


def test_debug_root_used_only_when_trusted_and_links_followed_inside(tmp_path):
    """Fedora's .build-id entries are links into the same root: followed there."""
    lib = build_lib(tmp_path)
    debug = split(lib, "unlinked.debug")
    build_id = read_build_id(lib)
    root = tmp_path / "dbg"
    entry = root / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"
    entry.parent.mkdir(parents=True)
    entry.symlink_to(debug.rename(root / "libdemo.so.debug"))
    assert DebugFileFinder(debug_dirs=(str(root),), debuginfod=None).find(ElfImage(lib)) \
        == (str(entry), True)
    root.chmod(0o777)
    finder = DebugFileFinder(debug_dirs=(str(root),), debuginfod=None)
    assert finder.find(ElfImage(lib)) == (None, True)
    assert finder.notes == [f"debug directory {root} not used: {root} is writable by group "
                            "or others"]
    root.chmod(0o755)


def test_debug_file_is_checked_when_loaded_not_only_when_found(tmp_path):
    """A module loaded again (a pending download) re-opens its debug file: one replaced
    by another build's since is not used."""
    lib = build_lib(tmp_path)
    debug = split(lib)
    finder = no_finder()
    image = ElfImage(lib)
    assert finder.find_image(image)[0] is not None
    other = build_lib(tmp_path / "other", source="int other(void) { return 7; }\n")
    subprocess.run(["objcopy", "--only-keep-debug", str(other), str(debug)], check=True)
    assert finder.find_image(image) == (None, True)


def perf_map_of(tmp_path: Path, make: str, uid_line: str) -> Path:
    """A fake /proc with process 4242 in a pid namespace (pid 7 there)."""
    proc = tmp_path / "proc"
    (proc / "4242" / "root" / "tmp").mkdir(parents=True)
    (proc / "4242" / "status").write_text(f"Name:\tnode\n{uid_line}NSpid:\t4242\t7\n")
    target = proc / "4242" / "root" / "tmp" / "perf-7.map"
    if make == "file":
        target.write_text("1000 10 in_container\n")
    elif make == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to(make)
    return proc


def test_perf_map_owner_must_be_the_process_or_root(tmp_path):
    me = os.geteuid()
    proc = perf_map_of(tmp_path, "file", f"Uid:\t{me}\t{me}\t{me}\t{me}\n")
    assert load_perf_map(4242, proc).lookup(0x1004) == ("in_container", 4)
    assert load_perf_map(4242, proc, owners={me}).lookup(0x1004) == ("in_container", 4)
    if me != 0:  # a file root owns is always taken
        refused = load_perf_map(4242, proc, owners={me + 1})
        assert refused.entries == [] and refused.note == (
            f"perf map {proc}/4242/root/tmp/perf-7.map: owned by uid {me}, not by uid 0 or "
            f"{me + 1}: JIT frames not named")
        gone = perf_map_of(tmp_path / "gone", "file", "")  # no Uid: the process is gone
        assert load_perf_map(4242, gone).note.endswith(f"owned by uid {me}, not by uid 0: "
                                                       "JIT frames not named")


@pytest.mark.parametrize("make,why", [("fifo", "is a FIFO, not a regular file"),
                                      ("/etc/passwd", "is a symbolic link, not followed")])
def test_perf_map_fifo_or_link_is_a_note(tmp_path, make, why):
    proc = perf_map_of(tmp_path, make, "")
    refused = load_perf_map(4242, proc, owners={os.geteuid()})
    assert refused.entries == []
    assert refused.note == f"perf map {proc}/4242/root/tmp/perf-7.map: {why}: JIT frames " \
                           "not named"


def test_symbolizer_notes_a_refused_perf_map_once_for_its_process(tmp_path):
    """This test's own process stands for the traced one: its uids are learnt while it
    lives, its map is a FIFO."""
    pid = os.getpid()
    path = Path(f"/tmp/perf-{pid}.map")
    os.mkfifo(path)
    try:
        sym = Symbolizer(BuildIdIndex(), finder=no_finder())
        sym.index.watch_process(pid)
        assert sym.index.uids(pid) == frozenset({os.getuid(), os.geteuid()})
        assert sym.perf_map(pid).entries == []
        seen = f"/proc/{pid}/root{path}"  # alive: read through its root
        assert sym.take_notes(pid) == [f"perf map {seen}: is a FIFO, not a regular file: JIT "
                                       "frames not named"]
        assert sym.take_notes(pid) == []
    finally:
        path.unlink()


def test_library_fifo_or_device_is_a_note_not_a_wait(tmp_path):
    fifo = tmp_path / "libx.so (deleted)"
    os.mkfifo(fifo)
    index = BuildIdIndex()
    index.add_library(str(fifo), 77)
    index.add_library("/dev/null", 77)
    index.add_library(str(tmp_path / "absent.so"), 77)  # gone: no note
    assert index.take_notes(77) == [
        f"library {fifo}: is a FIFO, not a regular file: not read",
        "library /dev/null: is a character device, not a regular file: not read"]


def test_library_link_indexed_under_the_file_it_names(tmp_path):
    lib = build_lib(tmp_path)
    (tmp_path / "libdemo.so.1").symlink_to(lib)
    index = BuildIdIndex()
    build_id = index.add(str(tmp_path / "libdemo.so.1"))
    assert build_id == read_build_id(lib) and index.find(build_id) == str(lib)


def test_container_library_links_resolve_inside_its_root(tmp_path):
    """An absolute link inside a container's root names the container's file, never the
    host's one of the same name."""
    root = tmp_path / "root"
    (root / "usr" / "lib").mkdir(parents=True)
    inside = build_lib(root / "opt", "libreal.so")
    (root / "usr" / "lib" / "libx.so").symlink_to("/opt/libreal.so")
    host = build_lib(tmp_path / "opt", "libreal.so",
                     source="int host_only(void) { return 1; }\n")
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        index = BuildIdIndex()
        index.add_foreign(fd, "/proc/4242/root", "/usr/lib/libx.so")
        assert index.find(read_build_id(inside)) is not None
        assert index.find(read_build_id(host)) is None
        os.mkfifo(root / "usr" / "lib" / "libfifo.so")
        index.add_foreign(fd, "/proc/4242/root", "/usr/lib/libfifo.so", 4242)
        assert index.take_notes(4242) == ["library /proc/4242/root/usr/lib/libfifo.so: is a "
                                          "FIFO, not a regular file: not read"]
    finally:
        os.close(fd)


@pytest.mark.parametrize("dwarf", ["-gdwarf-4", "-gdwarf-5"])
def test_lines_from_dwarf_without_addr2line(tmp_path, monkeypatch, dwarf):
    """file:line come from the DWARF read in Python: no external program runs."""
    src = tmp_path / "demo.c"
    src.write_text("int twice(int x)\n{\n\treturn 2 * x;\n}\n\nint main(void) { return "
                   "twice(3); }\n")
    exe = tmp_path / "demo"
    subprocess.run(["gcc", dwarf, "-O0", "-o", str(exe), str(src)], check=True)

    def no_program(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a program was run: {args}")
    monkeypatch.setattr(subprocess, "run", no_program)
    monkeypatch.setattr(subprocess, "Popen", no_program)
    sym = Symbolizer(BuildIdIndex(), finder=no_finder())
    (start,) = [s for n, s, _ in sym.module(str(exe)).names if n == "twice"]
    assert sym.source_line(str(exe), start) == (str(src), 2)
    assert sym.source_line(str(exe), 0) == ("", 0)


def test_lines_of_a_stripped_module_come_from_its_debug_file(tmp_path):
    lib = build_lib(tmp_path)
    debug = split(lib)
    mod = ModuleSymbols.load(str(lib), no_finder())
    (start,) = [s for n, s, _ in mod.names if n == "exported"]
    assert mod.debug_path == str(debug)
    file, line = mod.line(start)
    assert file == str(tmp_path / "demo.c") and line == 3

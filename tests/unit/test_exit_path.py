"""The exit scan's view of the thread held at `_exit` (reach/exitframes.py, valgrind's
definedness rule for libc's exit frames) and its check that the process stayed
stopped (session/exitscan.py), without a traced process."""

from __future__ import annotations

from pathlib import Path

from refcntd.reach.exitframes import ExitPath, ExitWalk, Row, _parse, _Table, walk_exit
from refcntd.reach.memory import Mapping
from refcntd.reach.roots import Thread, find_roots
from refcntd.session.exitscan import still_stopped

READELF = """\
00000000 0000000000000014 00000000 CIE
  Version:               1
   LOC           CFA      ra
0000000000000000 rsp+8    c-8

00000018 0000000000000010 0000001c FDE cie=00000000 pc=0000000000000100..0000000000000120

00000030 0000000000000030 00000034 FDE cie=00000000 pc=0000000000000200..0000000000000280
   LOC           CFA      rbx   r15   ra
0000000000000200 rsp+8    u     u     c-8
0000000000000202 rsp+16   u     c-16  c-8
0000000000000204 rsp+24   c-24  c-16  c-8
0000000000000208 rsp+64   c-24  c-16  c-8

00000068 0000000000000014 0000006c FDE cie=00000000 pc=0000000000000300..0000000000000320
   LOC           CFA      ra
0000000000000300 rsp+8    c-8
0000000000000304 rsp+16   c-8
"""
# _exit at 0x100 (rows from its CIE), __run_exit_handlers at 0x200, exit at 0x300
TABLE = _Table([0x100, 0x200, 0x300], _parse(READELF.splitlines()),
               {"_exit": (0x100, 0x120), "exit": (0x300, 0x320)})
LIBC = 0x7000_0000


class FakeMemory:
    def __init__(self, words: dict[int, int]) -> None:
        self.words = words

    def word(self, address: int) -> int | None:
        return self.words.get(address)


def test_rows_inherit_their_cie_and_keep_saved_registers() -> None:
    assert TABLE.row(0x104) == Row(0x100, 8, ())
    assert TABLE.row(0x210) == Row(0x208, 64, (24, 16))


def test_exit_frames_keep_only_the_saved_registers(monkeypatch) -> None:
    """_exit at sp; __run_exit_handlers' frame (CFA sp+8+64) with rbx and r15 saved;
    exit's (CFA +16): the exit path ends where exit's caller's frame begins."""
    monkeypatch.setattr("refcntd.reach.exitframes.libc_frames", lambda path: TABLE)
    sp = 0x7ffd_0000
    mem = FakeMemory({sp: LIBC + 0x250, sp + 8 + 64 - 8: LIBC + 0x30a})
    maps = [Mapping(LIBC, LIBC + 0x1000, "r-xp", 0, 1, "/lib/libc.so.6")]
    walk = walk_exit(mem, maps, sp, LIBC + 0x104)  # type: ignore[arg-type]
    cfa1 = sp + 8 + 64
    assert walk == ExitWalk(ExitPath(sp, cfa1 + 16, (cfa1 - 24, cfa1 - 16)), True)
    assert walk_exit(mem, maps, sp, LIBC + 0x210) == ExitWalk()  # type: ignore[arg-type]
    mem.words[cfa1 - 8] = LIBC + 0x900  # __run_exit_handlers not called by exit
    assert walk_exit(mem, maps, sp, LIBC + 0x104) == ExitWalk()  # type: ignore[arg-type]


def test_an_exit_called_from_outside_libc_skipped_exit(monkeypatch) -> None:
    """The program's own `_exit`, or __run_exit_handlers called by quick_exit: the unwind
    returns to the program before it meets `exit` (no atexit handler ran)."""
    monkeypatch.setattr("refcntd.reach.exitframes.libc_frames", lambda path: TABLE)
    sp, program = 0x7ffd_0000, 0x5555_0000_1234
    maps = [Mapping(LIBC, LIBC + 0x1000, "r-xp", 0, 1, "/lib/libc.so.6"),
            Mapping(LIBC + 0x1000, LIBC + 0x3000, "rw-p", 0x1000, 1, "/lib/libc.so.6")]
    direct = FakeMemory({sp: program})
    assert walk_exit(direct, maps, sp, LIBC + 0x104) == \
        ExitWalk(exit_ran=False)  # type: ignore[arg-type]
    quick = FakeMemory({sp: LIBC + 0x250, sp + 8 + 64 - 8: program})
    assert walk_exit(quick, maps, sp, LIBC + 0x104) == \
        ExitWalk(exit_ran=False)  # type: ignore[arg-type]
    inside = FakeMemory({sp: LIBC + 0x2100})  # libc's other mapping, no row: can't tell
    assert walk_exit(inside, maps, sp, LIBC + 0x104) == ExitWalk()  # type: ignore[arg-type]


def test_the_held_threads_stack_starts_above_its_exit_frames() -> None:
    stack = Mapping(0x7ffd_0000 - 0x1000, 0x7ffd_2000, "rw-p", 0, 0, "[stack]")
    t = Thread(7, "gio", 0x7ffd_0000, (), LIBC + 0x104)
    path = ExitPath(0x7ffd_0000, 0x7ffd_0058, (0x7ffd_0030, 0x7ffd_0038))
    roots, _ = find_roots([stack], [t], 7, [], {7: path})
    spans = sorted((r.start, r.end) for r in roots if r.what == "stack")
    assert spans == [(0x7ffd_0030, 0x7ffd_0038), (0x7ffd_0038, 0x7ffd_0040),
                     (0x7ffd_0058, 0x7ffd_2000)]
    roots, _ = find_roots([stack], [t], 7, [])  # no exit path: from the red zone on
    assert [(r.start, r.end) for r in roots] == [(0x7ffd_0000 - 128, 0x7ffd_2000)]


def test_still_stopped_wants_every_thread_stopped(tmp_path: Path) -> None:
    for tid, state in ((1, "T"), (2, "t")):
        (tmp_path / "5" / "task" / str(tid)).mkdir(parents=True)
        (tmp_path / "5" / "task" / str(tid) / "stat").write_text(f"{tid} (a b) {state} 1 2")
    assert still_stopped(5, tmp_path)
    (tmp_path / "5" / "task" / "1" / "stat").write_text("1 (a) Z 1 2")
    assert not still_stopped(5, tmp_path)
    assert not still_stopped(6, tmp_path)  # gone


def test_libc_exit_frames_come_from_the_cache_as_read(tmp_path: Path, monkeypatch) -> None:
    """The machine's libc: read with readelf once, then from its cache entry by build-id
    with the same rows; a malformed entry is read again, a malformed row stops nothing
    but its own unwind."""
    import json
    import random

    from refcntd.reach import exitframes
    monkeypatch.setattr(exitframes, "CACHE_DIR", tmp_path)
    libc = "/usr/lib/x86_64-linux-gnu/libc.so.6"
    exitframes._frames.cache_clear()
    first = exitframes._frames(libc)
    (entry,) = (tmp_path / "exitframes").iterdir()
    exitframes._frames.cache_clear()
    cached = exitframes._frames(libc)
    assert first is not None and cached is not None and first.functions == cached.functions
    assert set(first.functions) == {"exit", "_exit"}
    assert all(first.row(pc) == cached.row(pc)
               for pc in random.Random(1).sample(range(first.starts[-1]), 5000))
    entry.write_text("[1, 2")  # not JSON: read again from libc, and rewritten
    exitframes._frames.cache_clear()
    assert exitframes._frames(libc) == first
    data = json.loads(entry.read_text())
    data["fdes"] = [[lo, hi, [["x"]]] for lo, hi, _ in data["fdes"]]
    entry.write_text(json.dumps(data))
    exitframes._frames.cache_clear()
    broken = exitframes._frames(libc)
    assert broken is not None and broken.row(first.functions["_exit"][0]) is None
    exitframes._frames.cache_clear()

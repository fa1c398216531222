"""The reachability scan (refcntd/reach/) on a stopped process, against valgrind on
the same program: each object's leak kind must be valgrind's.  No BPF here: the
fixture stops itself where it would exit; the scan reads it as it would at a hold."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import numpy as np
import pytest
from conftest import FIXTURES, cc
from reachtruth import fixture_objects, lsan_kind, private_loader, valgrind_kinds

from refcntd.reach import chunks, livecopy, memory
from refcntd.reach.scan import ReachScan, copy_process, finish, read_copy, scan_process
from refcntd.session.exitscan import wait_stopped as every_thread_stopped

OBJECTS = 14


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """(program for refcntd, the same for valgrind) at -O2 without frame pointers."""
    out = tmp_path_factory.mktemp("reach")
    flags = ["-O2", "-fomit-frame-pointer", "-pthread"]
    sources = [FIXTURES / "reach.c", FIXTURES.parent.parent / "examples/refcnt.c"]
    exe = cc(out / "reach", sources, flags)
    vg = cc(out / "reach-vg", sources, [*flags, *private_loader(out)])
    return exe, vg


def wait_stopped(pid: int) -> None:
    """Every thread, not only the one that raised SIGSTOP: a thread still running when
    the scan reads it has no stack pointer (its stack is then "of an unknown thread")."""
    if not every_thread_stopped(pid, timeout_s=5.0):
        pytest.fail(f"process {pid} never stopped")


def scan_stopped(exe):
    proc = subprocess.Popen([str(exe), "stop"], stdout=subprocess.PIPE, text=True)
    lines = []
    while len(lines) < OBJECTS:
        lines.append(proc.stdout.readline())
    objects = fixture_objects("".join(lines))
    try:
        wait_stopped(proc.pid)
        result = scan_process(proc.pid)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait(timeout=10)
    return objects, result, result.kinds_of(objects)


def test_scan_kinds_equal_valgrinds(programs):
    exe, vg = programs
    truth = valgrind_kinds([str(vg), "exit"])
    objects, result, kinds = scan_stopped(exe)
    assert result.complete, result.notes
    assert len(objects) == OBJECTS
    for address, (name, size) in objects.items():
        (expected,) = truth[size]
        got = kinds[address]
        assert got.kind == lsan_kind(expected), (name, got, expected)
        assert got.interior_only == (expected == "possibly lost"), (name, got)
        assert got.own_block, name


def test_scan_names_one_root_per_reachable_object(programs):
    objects, result, kinds = scan_stopped(programs[0])
    by_name = {objects[a][0]: k for a, k in kinds.items()}
    assert by_name["global_cache"].root == "global cache (reach)"
    assert by_name["big_kept"].root == "global big_cache (reach)"
    assert by_name["arena_global"].root == "global arena_cache (reach)"
    assert by_name["interior"].root == "global mid_ptr (reach)"
    # named by the frame whose words hold them (reach/stackframes.py): main's local, held
    # while main is stopped in raise() (the lowest word found may be a stale copy in
    # libc's frames below it: named so); the live thread's local, while it waits in pause()
    assert re.fullmatch(rf"the stack of thread {result.pid} \(reach\) in frame (main "
                        r"\(reach\)|\w+ \(libc\.so\.6\)|libc\.so\.6\+0x[0-9a-f]+)",
                        by_name["stack_held"].root), by_name["stack_held"].root
    assert re.fullmatch(r"the stack of thread \d+ \(reach\) in frame holder_thread \(reach\)",
                        by_name["thread_stack"].root), by_name["thread_stack"].root
    assert by_name["thread_stack"].root != by_name["stack_held"].root
    lost = [n for n, k in by_name.items() if k.kind != "still reachable"]
    assert all(not by_name[n].root for n in lost)


def test_scan_leaves_out_freed_chunks(programs):
    """stale_lost is pointed to only from chunks sitting in the tcache and a fastbin:
    counted as blocks they would make it reachable (their memory is reachable from
    the tcache itself)."""
    objects, result, kinds = scan_stopped(programs[0])
    stale = next(a for a, (n, _) in objects.items() if n == "stale_lost")
    assert kinds[stale].kind == "definitely lost"
    assert result.heap.free_chunks >= 9  # 7 in the tcache, 2 in a fastbin


def test_scan_without_the_compiled_walker_is_the_same(programs, monkeypatch):
    """Where scripts/setup.sh did not build reach/_chunkwalk.so, the numpy walk and
    filter and two reads of the heap: the same kinds, roots and blocks, and one note."""
    objects, result, kinds = scan_stopped(programs[0])
    assert chunks.compiled() is not None and not any("_chunkwalk" in n for n in result.notes)
    monkeypatch.setattr(chunks, "compiled", lambda: None)
    objects2, result2, kinds2 = scan_stopped(programs[0])
    def named(objects, kinds):  # a thread's id (and at times its name) vary by run
        return {objects[a][0]: (k.kind, re.sub(r"the stack of thread .*", "a stack", k.root),
                                k.interior_only) for a, k in kinds.items()}
    assert named(objects, kinds) == named(objects2, kinds2)
    assert (result2.blocks, result2.lost_blocks, result2.heap.free_chunks) == \
        (result.blocks, result.lost_blocks, result.heap.free_chunks)
    assert [n for n in result2.notes if "_chunkwalk.so missing" in n]


def test_scan_from_one_read_of_the_small_mappings_is_the_same(programs, monkeypatch):
    """The small writable mappings read at once (ProcessMemory.snapshot) and served from
    there: the same kinds, roots and blocks as reading each range when it is needed
    (the fixture's 8 MiB thread stack is too big: read as before), in fewer calls."""
    objects, result, kinds = scan_stopped(programs[0])
    monkeypatch.setattr(memory, "SNAP_TOTAL", 0)
    objects2, result2, kinds2 = scan_stopped(programs[0])
    def named(objects, kinds):
        return {objects[a][0]: (k.kind, re.sub(r"the stack of thread .*", "a stack", k.root),
                                k.interior_only, k.own_block) for a, k in kinds.items()}
    assert named(objects, kinds) == named(objects2, kinds2)
    assert (result.blocks, result.lost_blocks, result.heap.free_chunks) == \
        (result2.blocks, result2.lost_blocks, result2.heap.free_chunks)
    assert result.reads < result2.reads / 2, (result.reads, result2.reads)


@pytest.mark.parametrize("count,threads", [(30_000, 1), (200, 0)])
def test_compiled_fastbin_walk_finds_every_freed_chunk(tmp_path, monkeypatch, count, threads):
    """chunkwalk.c's refcntd_fastbins against the truth the program prints (every chunk
    it freed, all to fastbins with the tcache off) and against glibc.py's walk in
    Python: the same free chunks, in the main arena and a thread's, with fewer reads."""
    from refcntd.reach import glibc

    exe = cc(tmp_path / "fastbins", [FIXTURES / "fastbins.c"], ["-O2", "-pthread"])
    out = tmp_path / "freed.txt"
    env = {**os.environ, "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}
    with open(out, "w") as stdout:
        proc = subprocess.Popen([str(exe), str(count), str(threads)], stdout=stdout, env=env)
    try:
        wait_stopped(proc.pid)
        truth = {int(line, 16) for line in out.read_text().split()}
        maps = memory.read_maps(proc.pid)
        heaps = {}
        for how in ("compiled", "python"):
            if how == "python":
                monkeypatch.setattr(glibc, "follow_fastbins", lambda *_: None)
            mem = memory.ProcessMemory(proc.pid)
            heaps[how] = (glibc.read_heap(mem, maps), mem.reads)
            mem.close()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait(timeout=10)
    (fast, fast_reads), (slow, slow_reads) = heaps["compiled"], heaps["python"]
    assert chunks.compiled() is not None
    assert len(truth) == count * (1 + threads)
    assert truth <= set(fast.free.tolist()), len(truth - set(fast.free.tolist()))
    assert fast.free.tolist() == slow.free.tolist()
    assert not [n for n in fast.notes if "fastbin" in n], fast.notes
    assert fast_reads <= slow_reads


def copy_scan(pid: int) -> ReachScan:
    """GET /leaks's scan (service/leakscan.py): copied in the stop, read from the copy."""
    prep = livecopy.prepare(pid)
    assert not isinstance(prep, str), prep
    copied = copy_process(prep)
    assert not isinstance(copied, str), copied
    out = read_copy(copied)
    finish(out)
    return out


def same_scan(a: ReachScan, b: ReachScan, objects) -> None:
    """Everything a scan produces, equal: each object's kind (its root, interior-only,
    own block, lost with, block), the blocks, freed chunks, roots, notes, and the kinds
    arrays of every block."""
    assert a.complete and b.complete, (a.notes, b.notes)
    assert a.kinds_of(objects) == b.kinds_of(objects)
    assert a.freed(objects) == b.freed(objects)
    assert (a.blocks, a.lost_blocks, a.heap_bytes, a.heap.free_chunks) == \
        (b.blocks, b.lost_blocks, b.heap_bytes, b.heap.free_chunks)
    for name in ("starts", "ends", "tails", "freed", "freed_ends"):
        assert np.array_equal(getattr(a.heap, name), getattr(b.heap, name)), name
    assert a.heap.regions == b.heap.regions and a.roots == b.roots and a.notes == b.notes
    assert a.kinds is not None and b.kinds is not None
    for name in ("state", "root", "root_word", "leader"):
        assert np.array_equal(getattr(a.kinds, name), getattr(b.kinds, name)), name


@pytest.mark.parametrize("walker", ["compiled", "numpy"])
def test_the_copy_scans_what_the_stopped_scan_does(programs, monkeypatch, walker):
    """Issue 57: the live scan copies the memory in the stop and scans the copy once
    the process runs again.  On one stopped process, both ways: every kind, root and
    block the same, and the copy's read made in a handful of calls."""
    if walker == "numpy":
        monkeypatch.setattr(chunks, "compiled", lambda: None)
    proc = subprocess.Popen([str(programs[0]), "stop"], stdout=subprocess.PIPE, text=True)
    lines = [proc.stdout.readline() for _ in range(OBJECTS)]
    objects = fixture_objects("".join(lines))
    try:
        wait_stopped(proc.pid)
        assert every_thread_stopped(proc.pid)  # else a thread's stack pointer may differ
        stopped = scan_process(proc.pid)
        copied = copy_scan(proc.pid)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait(timeout=10)
    assert len(stopped.kinds_of(objects)) == OBJECTS
    same_scan(stopped, copied, objects)
    assert copied.reads <= 3 < stopped.reads, (copied.reads, stopped.reads)


def test_the_copy_follows_the_fastbins_as_the_process_read(tmp_path):
    """A copy's fastbin lists are followed in Python (chunkwalk.c reads the process):
    the same free chunks as the compiled walk over the stopped process, 30 000 of them
    in a thread's arena and the main one."""
    from refcntd.reach import glibc

    exe = cc(tmp_path / "fastbins", [FIXTURES / "fastbins.c"], ["-O2", "-pthread"])
    env = {**os.environ, "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}
    with open(tmp_path / "freed.txt", "w") as stdout:
        proc = subprocess.Popen([str(exe), "30000", "1"], stdout=stdout, env=env)
    try:
        wait_stopped(proc.pid)
        maps = memory.read_maps(proc.pid)
        mem = memory.ProcessMemory(proc.pid)
        direct = glibc.read_heap(mem, maps)
        mem.close()
        prep = livecopy.prepare(proc.pid)
        assert not isinstance(prep, str), prep
        copied = copy_process(prep)
        assert not isinstance(copied, str), copied
        copied.prep.mem.detached = True
        from_copy = glibc.read_heap(copied.prep.mem, copied.maps)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait(timeout=10)
    assert len(direct.free) >= 60_000
    assert direct.free.tolist() == from_copy.free.tolist()
    assert [len(r.addr) for r in direct.runs] == [len(r.addr) for r in from_copy.runs]


def test_the_soft_dirty_pre_copy_sees_what_changed_before_the_stop(tmp_path):
    """With soft-dirty pages (Debian's kernels; benchmarks/kernels.py runs this there),
    the copy made while tests/fixtures/softdirty.c runs, then in the stop only the pages
    written since: the same scan as the stopped one, though between the two a global
    came to point to a lost block and a page holding the only pointer to another was
    released.  Without them (this machine's 6.18), GET /leaks falls back to the copy."""
    from refcntd.kernel import features
    from refcntd.service import leakscan

    exe = cc(tmp_path / "softdirty", [FIXTURES / "softdirty.c"], ["-O2"])
    proc = subprocess.Popen([str(exe)], stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                            text=True)
    lines = [proc.stdout.readline() for _ in range(4)]
    objects = {int(line.split()[1], 16): (line.split()[0], 0) for line in lines[:3]}
    try:
        if not features.current().soft_dirty:
            live = leakscan.scan_live(proc.pid, budget_s=10)
            assert live.how == "copy" and live.scan is not None, live
            return
        prep = livecopy.prepare(proc.pid, soft_dirty=True)
        assert not isinstance(prep, str) and prep.soft_dirty, prep
        os.kill(proc.pid, signal.SIGUSR1)
        assert proc.stdout.readline() == "MOVED\n"
        os.kill(proc.pid, signal.SIGSTOP)
        wait_stopped(proc.pid)
        stopped = scan_process(proc.pid)
        copied = copy_process(prep)
        assert not isinstance(copied, str), copied
        scan = read_copy(copied)
        finish(scan)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    by_name = {objects[a][0]: k for a, k in stopped.kinds_of(objects).items()}
    assert by_name["swapped"].root == "global global_swap (softdirty)"
    assert by_name["dropped"].kind == "definitely lost"
    same_scan(stopped, scan, objects)
    assert 0 < prep.recopied < scan.bytes_read / 2, (prep.recopied, scan.bytes_read)

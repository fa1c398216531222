"""Modules one process's symbolizers share (serve: one tracer per target and build).

Each tracer loading libc's symbols and lines for itself held megabytes of small
objects per target, and a target added by a reload (or a new build) made them
again, leaving pymalloc arenas behind when it went (benchmarks/results/soak.md).
Real files built by gcc; the report workers that share a module take turns.
"""

from __future__ import annotations

import gc
import os
import shutil
import threading
import time
import weakref

from test_symbolize import SOURCE, build_lib, split

from refcntd.session.worker import ReportWorker
from refcntd.symbolize.debugfiles import DebugFileFinder
from refcntd.symbolize.symbolizer import BuildIdIndex, Symbolizer
from refcntd.symbolize.turn import SYMBOLIZE


def symbolizer(*dirs: str) -> Symbolizer:
    return Symbolizer(BuildIdIndex(), finder=DebugFileFinder(debug_dirs=dirs, debuginfod=None))


def test_two_symbolizers_share_one_load_of_a_module(tmp_path):
    lib = str(build_lib(tmp_path))
    first, second = symbolizer(), symbolizer()
    mod = first.module(lib)
    assert mod is not None and second.module(lib) is mod
    assert mod.lookup(next(s for n, s, _ in mod.names if n == "exported")) == ("exported", 0)
    assert symbolizer("/elsewhere").module(lib) is not mod  # other debug files, other load


def test_a_replaced_file_is_loaded_again(tmp_path):
    lib = build_lib(tmp_path)
    mod = symbolizer().module(str(lib))
    other = build_lib(tmp_path / "new", source=SOURCE + "int added(void) { return 7; }\n")
    shutil.copy(other, lib.with_name("next.so"))
    os.replace(lib.with_name("next.so"), lib)  # an upgrade renamed over the old file
    again = symbolizer().module(str(lib))
    assert again is not mod and "added" in {n for n, _, _ in again.names}
    assert mod is not None and "added" not in {n for n, _, _ in mod.names}


def test_a_module_no_symbolizer_holds_is_let_go(tmp_path):
    lib = str(build_lib(tmp_path))
    sym = symbolizer()
    gone = weakref.ref(sym.module(lib))  # type: ignore[arg-type]
    assert gone() is not None
    del sym
    gc.collect()
    assert gone() is None  # the shared table keeps no module alive


def test_a_debug_file_installed_since_is_not_hidden_by_the_shared_copy(tmp_path):
    """libc6-dbg installed while serve runs: the next target's tracer has the lines."""
    lib = build_lib(tmp_path)
    debug = split(lib)
    kept = debug.read_bytes()
    debug.unlink()
    root = tmp_path / "root"
    held = symbolizer(str(root))
    mod = held.module(str(lib))
    assert mod is not None and mod.debug is None
    under = root / str(tmp_path.resolve()).lstrip("/") / debug.name
    under.parent.mkdir(parents=True)
    under.write_bytes(kept)
    fresh = symbolizer(str(root)).module(str(lib))
    assert fresh is not None and fresh is not mod and fresh.debug is not None
    assert "helper" in {n for n, _, _ in fresh.names}


def test_views_given_to_two_workers_take_turns():
    """Two targets' views (a diff, a pprof profile) handed to their workers from HTTP
    threads never use the shared modules at once; a stopped worker's runs in turn too."""
    inside, most = [0], [0]
    lock = threading.Lock()

    def view() -> int:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.01)
        with lock:
            inside[0] -= 1
        return 1
    workers = [ReportWorker(f"w{i}") for i in range(3)]
    workers[2].stop()
    threads = [threading.Thread(target=lambda w=w: [w.call(view) for _ in range(10)])
               for w in workers for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in workers:
        w.close()
    assert most[0] == 1


def test_a_job_waiting_on_a_download_lets_the_others_run():
    """A debuginfod download waited for (up to its timeout) holds no other target's
    reports: the waiting job steps aside."""
    waiting, other_ran = threading.Event(), threading.Event()

    def slow() -> None:
        with SYMBOLIZE.aside():
            waiting.set()
            assert other_ran.wait(5)
    a, b = ReportWorker("a"), ReportWorker("b")
    done = threading.Thread(target=a.call, args=(slow,))
    done.start()
    assert waiting.wait(5)
    b.call(other_ran.set, timeout_s=5)
    done.join()
    a.close()
    b.close()
    assert other_ran.is_set()

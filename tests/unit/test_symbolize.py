"""Where symbols come from: .dynsym, separate debug files, debuginfod, perf maps.

Real ELF files built by gcc and split by objcopy; a real HTTP server on
loopback for debuginfod.  No BPF: tests/bpf/test_symbols.py runs the same
through real stacks.
"""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from refcntd.binary.elf import ElfImage, read_build_id
from refcntd.symbolize.debugfiles import DebugFileFinder
from refcntd.symbolize.debuginfod import DebuginfodClient, Pending
from refcntd.symbolize.modules import ModuleSymbols
from refcntd.symbolize.perfmap import PerfMap, load_perf_map, perf_map_paths

SOURCE = """
__attribute__((noinline)) static int helper(int x) { return x * 3 + 1; }
__attribute__((noinline)) int exported(int x) { return helper(x) + 2; }
"""


def build_lib(tmp: Path, name: str = "libdemo.so", source: str = SOURCE) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    src = tmp / "demo.c"
    src.write_text(source)
    out = tmp / name
    subprocess.run(["gcc", "-g", "-O2", "-fPIC", "-shared", "-o", str(out), str(src)],
                   check=True, capture_output=True)
    return out


def split(lib: Path, debug_name: str | None = None) -> Path:
    """Strip `lib` of everything; its debug file next to it, linked by name."""
    debug = lib.with_name(debug_name or f"{lib.name}.debug")
    subprocess.run(["objcopy", "--only-keep-debug", str(lib), str(debug)], check=True)
    subprocess.run(["objcopy", "--strip-all", f"--add-gnu-debuglink={debug.name}", str(lib)],
                   check=True, cwd=lib.parent)
    return debug


def names(mod: ModuleSymbols) -> set[str]:
    return {n for n, _, _ in mod.names}


def no_finder() -> DebugFileFinder:
    return DebugFileFinder(debug_dirs=(), debuginfod=None)


def test_stripped_library_keeps_dynsym_names(tmp_path):
    lib = build_lib(tmp_path)
    split(lib).unlink()
    mod = ModuleSymbols.load(str(lib), no_finder())
    assert names(mod) == {"exported"}  # the static helper went with .symtab
    assert mod.lines_path is None


# fontconfig's fcalias: the definition is a hidden IA__ name, the exported one an alias
ALIASED = """
__attribute__((noinline, visibility("hidden"))) int IA__FcThingCopy(int x) { return x + 1; }
extern __typeof(IA__FcThingCopy) FcThingCopy __attribute__((alias("IA__FcThingCopy"),
                                                            visibility("default")));
int call(int x) { return IA__FcThingCopy(x) * 2; }
__attribute__((noinline)) static int run_main_impl(int x) { return x * 3; }
extern __typeof(run_main_impl) run_main __attribute__((alias("run_main_impl")));
"""


def test_an_address_with_a_hidden_alias_is_named_by_its_exported_name(tmp_path):
    """A spec names FcPatternDestroy; fontconfig's own calls go to IA__FcPatternDestroy
    at the same address: the frame is named as the spec names it (else the probed
    function stays on every operation's path)."""
    lib = build_lib(tmp_path, source=ALIASED)
    mod = ModuleSymbols.load(str(lib), no_finder())
    assert {"IA__FcThingCopy", "FcThingCopy"} <= names(mod)
    start = next(s for n, s, _ in mod.names if n == "FcThingCopy")
    assert mod.lookup(start + 1) == ("FcThingCopy", 1)


def test_an_alias_that_is_not_a_prefixed_copy_keeps_its_own_name(tmp_path):
    """libc's __libc_start_main_impl is exported as __libc_start_main: gdb and the
    DWARF say _impl, and so do refcntd's stacks."""
    lib = build_lib(tmp_path, source=ALIASED)
    mod = ModuleSymbols.load(str(lib), no_finder())
    start = next(s for n, s, _ in mod.names if n == "run_main")
    assert mod.lookup(start) == ("run_main_impl", 0)


def test_debuglink_next_to_file_in_dot_debug_and_under_debug_root(tmp_path):
    lib = build_lib(tmp_path)
    debug = split(lib)
    found, final = no_finder().find(ElfImage(lib))
    assert (found, final) == (str(debug), True)
    (tmp_path / ".debug").mkdir()
    moved = debug.rename(tmp_path / ".debug" / debug.name)
    assert no_finder().find(ElfImage(lib))[0] == str(moved)
    root = tmp_path / "root"
    under = root / str(tmp_path.resolve()).lstrip("/") / debug.name
    under.parent.mkdir(parents=True)
    moved.rename(under)
    assert no_finder().find(ElfImage(lib))[0] is None
    finder = DebugFileFinder(debug_dirs=(str(root),), debuginfod=None)
    assert finder.find(ElfImage(lib))[0] == str(under)
    mod = ModuleSymbols.load(str(lib), finder)
    assert {"exported", "helper"} <= names(mod) and mod.lines_path == str(under)


def test_debuglink_with_wrong_crc_is_refused(tmp_path):
    lib = build_lib(tmp_path)
    debug = split(lib)
    other = build_lib(tmp_path / "other", source=SOURCE + "int more(void) { return 4; }\n")
    subprocess.run(["objcopy", "--only-keep-debug", str(other), str(debug)], check=True)
    assert no_finder().find(ElfImage(lib)) == (None, True)


def test_build_id_directory_and_mismatch(tmp_path):
    lib = build_lib(tmp_path)
    debug = split(lib, "unlinked.debug")
    build_id = read_build_id(lib)
    assert build_id and read_build_id(debug) == build_id
    root = tmp_path / "dbg"
    target = root / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"
    target.parent.mkdir(parents=True)
    debug.rename(target)
    finder = DebugFileFinder(debug_dirs=(str(tmp_path / "empty"), str(root)), debuginfod=None)
    assert finder.find(ElfImage(lib))[0] == str(target)
    foreign = build_lib(tmp_path / "f", source="int other_fn(void) { return 1; }\n")
    shutil.copy(foreign, target)  # right place, wrong file
    assert DebugFileFinder(debug_dirs=(str(root),), debuginfod=None).find(ElfImage(lib))[0] \
        is None


class Server(http.server.ThreadingHTTPServer):
    files: dict[str, bytes]
    release: threading.Event
    requests: list[str]


class Handler(http.server.BaseHTTPRequestHandler):
    server: Server

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.requests.append(self.path)
        self.server.release.wait(10)
        body = self.server.files.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[Server]:
    srv = Server(("127.0.0.1", 0), Handler)
    srv.files, srv.release, srv.requests = {}, threading.Event(), []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()


def url(srv: Server) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def test_debuginfod_late_download_goes_on_and_is_cached(tmp_path, server):
    lib = build_lib(tmp_path)
    debug = split(lib, "served.debug")
    build_id = read_build_id(lib)
    server.files[f"/buildid/{build_id}/debuginfo"] = debug.read_bytes()
    client = DebuginfodClient([url(server)], tmp_path / "cache", wait_s=0.2)
    with pytest.raises(Pending):  # the server holds the answer: the report goes on
        client.debuginfo(build_id)
    assert client.running(build_id)
    server.release.set()
    for _ in range(100):
        if not client.running(build_id):
            break
        threading.Event().wait(0.05)
    path = client.debuginfo(build_id)
    assert path == str(tmp_path / "cache" / build_id / "debuginfo")
    assert Path(path).read_bytes() == debug.read_bytes()
    again = DebuginfodClient([url(server)], tmp_path / "cache", wait_s=0.2)
    assert again.debuginfo(build_id) == path and len(server.requests) == 1  # from the cache


def test_debuginfod_miss_wrong_file_and_stalled_server(tmp_path, server):
    lib = build_lib(tmp_path)
    build_id = read_build_id(lib)
    server.release.set()
    client = DebuginfodClient([url(server)], tmp_path / "cache", wait_s=5)
    assert client.debuginfo(build_id) is None  # 404
    server.files[f"/buildid/{'ab' * 20}/debuginfo"] = lib.read_bytes()  # not that build-id
    assert client.debuginfo("ab" * 20) is None
    assert not (tmp_path / "cache" / ("ab" * 20) / "debuginfo").exists()
    server.release.clear()
    stalled = DebuginfodClient([url(server)], tmp_path / "cache", wait_s=5, stall_s=0.3)
    assert stalled.debuginfo("cd" * 20) is None and stalled.slow == {url(server)}
    before = len(server.requests)
    assert stalled.debuginfo("ef" * 20) is None and len(server.requests) == before


def test_perf_map_parse_and_lookup():
    text = ("7f0000001000 40 jit_a\n"
            "garbage line\n"
            "7f0000002000 zz bad_size\n"
            "7f0000003000 10 LazyCompile:*foo bar.js:1\n"
            "7f0000001000 20 jit_a_recompiled\n")
    pm = PerfMap.parse("/tmp/perf-1.map", text)
    assert pm.lookup(0x7f0000001010) == ("jit_a_recompiled", 0x10)
    assert pm.lookup(0x7f0000001020) is None  # past the later entry's size
    assert pm.lookup(0x7f0000003005) == ("LazyCompile:*foo bar.js:1", 5)
    assert pm.lookup(0x7f0000000fff) is None and pm.lookup(0x7f0000002005) is None


def test_perf_map_of_a_process_in_a_pid_namespace(tmp_path):
    proc = tmp_path / "proc"
    (proc / "4242" / "root" / "tmp").mkdir(parents=True)
    uid = os.geteuid()  # the map's owner must be the process's or root
    (proc / "4242" / "status").write_text(f"Name:\tnode\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
                                          "NSpid:\t4242\t7\n")
    (proc / "4242" / "root" / "tmp" / "perf-7.map").write_text("1000 10 in_container\n")
    paths = perf_map_paths(4242, proc)
    assert paths[0] == proc / "4242" / "root" / "tmp" / "perf-7.map"
    pm = load_perf_map(4242, proc)
    assert pm is not None and pm.lookup(0x1004) == ("in_container", 4)


def test_return_address_after_a_noreturn_call_is_its_caller(tmp_path):
    """A call to a noreturn function can be a function's last instruction: its return
    address is the first byte after the caller (forked workers ending in _exit)."""
    from refcntd.symbolize.symbolizer import BuildIdIndex, Symbolizer
    src = tmp_path / "nr.c"
    src.write_text("__attribute__((noreturn, noinline)) void die(int c) { for (;;) "
                   "__builtin_trap(); }\nint main(int argc, char **argv) { if (argc > 1) "
                   "return 0; die(argc); }\n")
    exe = tmp_path / "nr"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True)
    sym = Symbolizer(BuildIdIndex())
    mod = sym.module(str(exe))
    (start, size) = [(s, z) for n, s, z in mod.names if n == "main"][0]
    end = start + size  # where a call as main's last instruction returns to
    assert sym.frame((str(exe), end), "", True).function == "main"
    assert sym.frame((str(exe), end), "", True).offset == size

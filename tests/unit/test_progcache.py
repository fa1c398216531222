"""The compiled-program cache: what it keeps, and that it never trusts a bad entry."""

from __future__ import annotations

import ctypes as C
import json
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from refcntd.cli.argtypes import HISTORY_DEPTH
from refcntd.kernel import abi, knobs, progcache
from refcntd.kernel.layouts import history_sized, resized
from refcntd.kernel.program import KernelOptions, bpf_cflags, cache_key, program_text
from refcntd.paths import BPF_DIR

LD_IMM64 = 0x18


def insn(op: int, src: int = 0, dst: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", op, (src << 4) | dst, off, imm)


def program(fd: int, src: int = 1) -> bytes:
    """r1 = map[fd]; (second half of ld_imm64); r0 = 0; exit"""
    return insn(LD_IMM64, src=src, dst=1, imm=fd) + insn(0) + insn(0xb7) + insn(0x95)


def test_maps_only_keeps_every_map_and_no_function():
    text = program_text()
    stub = progcache.maps_only(text)
    maps = re.compile(r"^BPF_\w+\(.*\);", re.M)
    assert maps.findall(stub) == maps.findall(text) and len(maps.findall(text)) > 20
    for needle in ("int on_probe(", "TRACEPOINT_PROBE(", "static __always_inline", "ctx->"):
        assert needle in text and needle not in stub, needle
    # preprocessor structure survives: every #if has its #endif
    opened = sum(1 for line in stub.splitlines() if re.match(r"#\s*if", line))
    assert opened == sum(1 for line in stub.splitlines() if re.match(r"#\s*endif", line))


def test_multi_line_signatures_and_one_line_bodies():
    text = ("#if A\nstatic int f(int a,\n             int b) {}\n#endif\n"
            "BPF_HASH(m, int, int, 4);\nint g(void *ctx)\n{\n\tif (1) {\n\t}\n\treturn 0;\n}\n"
            "struct s {\n\tint x;\n};\n")
    assert progcache.maps_only(text) == "#if A\n#endif\nBPF_HASH(m, int, int, 4);\n" \
        "struct s {\n\tint x;\n};\nint refcntd_maps_only(void *ctx) { return 0; }\n"


def test_map_fds_become_names_and_come_back():
    fn = progcache.capture(program(7), {7: "objs"})
    assert fn.relocs == ((0, "objs"),)
    assert struct.unpack_from("<i", fn.code, 4)[0] == 0  # no fd of this process kept
    assert fn.relocated({"objs": 42}) == program(42)
    with pytest.raises(KeyError):
        fn.relocated({})


@pytest.mark.parametrize("code,fds", [(program(9), {7: "objs"}), (program(7, src=2), {7: "objs"})],
                         ids=["unknown-fd", "map-value"])
def test_other_references_are_not_cached(code, fds):
    with pytest.raises(progcache.Unrelocatable):
        progcache.capture(code, fds)


def entry() -> progcache.Entry:
    return progcache.Entry("k" * 64, ("objs", "stats"),
                           {"on_probe": progcache.capture(program(3), {3: "objs"})})


def test_round_trip(tmp_path):
    progcache.store(tmp_path, entry())
    assert progcache.load(tmp_path, "k" * 64) == entry()
    assert progcache.load(tmp_path, "j" * 64) is None


def _edit(tmp_path: Path, change) -> None:
    path = progcache.entry_path(tmp_path, "k" * 64)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("change", [
    lambda d: d["body"]["maps"].append("x"),  # digest no longer matches
    lambda d: d.update(key="j" * 64),  # written for another key
    lambda d: d.update(format=0),
    lambda d: d.pop("digest"),
])
def test_a_changed_entry_is_not_trusted(tmp_path, change):
    progcache.store(tmp_path, entry())
    _edit(tmp_path, change)
    assert progcache.load(tmp_path, "k" * 64) is None


def test_consistent_but_impossible_entries_are_not_trusted(tmp_path):
    """Even with a matching digest: a relocation outside the code or to an unlisted map."""
    for fn in (progcache.Function(program(0), ((9, "objs"),)),
               progcache.Function(program(0), ((0, "other"),)),
               progcache.Function(program(0)[:-3], ())):
        progcache.store(tmp_path, progcache.Entry("k" * 64, ("objs",), {"on_probe": fn}))
        assert progcache.load(tmp_path, "k" * 64) is None


def test_truncated_and_garbage_files(tmp_path):
    progcache.store(tmp_path, entry())
    path = progcache.entry_path(tmp_path, "k" * 64)
    path.write_bytes(path.read_bytes()[:100])
    assert progcache.load(tmp_path, "k" * 64) is None
    path.write_bytes(b"\xff\x00garbage")
    assert progcache.load(tmp_path, "k" * 64) is None


def test_prune_keeps_the_most_recent(tmp_path):
    for i in range(5):
        progcache.store(tmp_path, progcache.Entry(str(i) * 64, ("objs",), entry().functions))
    progcache.prune(tmp_path / "bpf", keep=2)
    assert sorted(p.name[:4] for p in (tmp_path / "bpf").glob("*.json")) == ["3333", "4444"]
    assert progcache.load(tmp_path, "4" * 64) is not None


def test_key_covers_text_flags_and_toolchain():
    base = progcache.entry_key("t", ["-DX=1"], {"bcc": "1"})
    assert len({base, progcache.entry_key("u", ["-DX=1"], {"bcc": "1"}),
                progcache.entry_key("t", ["-DX=2"], {"bcc": "1"}),
                progcache.entry_key("t", ["-DX=1"], {"bcc": "2"})}) == 4


def test_flags_that_only_size_maps_are_not_part_of_the_key():
    text = ("#ifndef MAX_X\n#define MAX_X 4\n#endif\n/* MAX_Y in a comment */\n"
            "BPF_HASH(m, int, int, MAX_X);\nBPF_ARRAY(a, int, MAX_Y);\n"
            "int f(void *ctx) { return MAX_Y + DEPTH; }\n")
    assert progcache.sizes_maps_only(text, "-DMAX_X=8")
    assert not progcache.sizes_maps_only(text, "-DMAX_Y=8")  # also in code
    assert not progcache.sizes_maps_only(text, "-DDEPTH=2")
    assert not progcache.sizes_maps_only(text, "-DABSENT=1")
    assert not progcache.sizes_maps_only(text, "-I/somewhere")
    key = progcache.entry_key(text, ["-DMAX_X=8", "-DDEPTH=2"], {})
    assert key == progcache.entry_key(text, ["-DMAX_X=16", "-DDEPTH=2"], {})
    assert key != progcache.entry_key(text, ["-DMAX_X=8", "-DDEPTH=3"], {})


OPTION_SETS = [  # run, run --history, attach/serve (holding, filters), unwinding off
    KernelOptions(filtered=True, has_delete=True),
    KernelOptions(filtered=True, has_delete=False, history=("all",), history_depth=256),
    KernelOptions(filtered=True, has_delete=True, history=("map", "dso"), history_depth=4,
                  exit_code_offset=2000),
    KernelOptions(filtered=False, has_delete=True, sites=True, hold=True,
                  unwind_offsets={"OFF_TASK_MM": 1}, comm_filter=("perf",), cgroup_id=7,
                  max_objects=4096, ringbuf_pages=16),
]


def test_every_option_set_has_the_same_key():
    """Every flag only sizes maps: one compiled program serves every option set."""
    text = program_text()
    keys = set()
    for opts in OPTION_SETS:
        cflags = bpf_cflags(opts, 16)
        assert all(f.startswith("-I") or progcache.sizes_maps_only(text, f) for f in cflags), \
            [f for f in cflags if not progcache.sizes_maps_only(text, f)]
        keys.add(cache_key(text, cflags))
    assert len(keys) == 1


def test_the_key_covers_every_header(tmp_path):
    shutil.copytree(BPF_DIR, tmp_path / "bpf")
    text, cflags = program_text(), bpf_cflags(OPTION_SETS[0], 16)
    base = cache_key(text, cflags, tmp_path / "bpf")
    headers = sorted((tmp_path / "bpf").glob("*.h"))
    assert {"refcntd.h", "knobs.h", "history.h"} <= {h.name for h in headers}
    for header in headers:
        original = header.read_text()
        header.write_text(original + "/* changed */\n")
        assert cache_key(text, cflags, tmp_path / "bpf") != base, header.name
        header.write_text(original)


def test_the_configuration_follows_the_options():
    run, history, types, serve = (knobs.config(o) for o in OPTION_SETS)
    assert (run.filtered, run.has_delete, run.sites, run.history, run.unwind) == (1, 1, 0, 0, 0)
    assert run.exit_code_off == -1 and run.cgroup_id == 0
    assert (history.history, history.history_all, history.history_depth) == (1, 1, 256)
    assert (types.history, types.history_all, types.history_depth) == (1, 0, 4)
    assert types.exit_code_off == 2000
    assert (serve.filtered, serve.sites, serve.hold, serve.unwind) == (0, 1, 1, 1)
    assert (serve.filter_comm, serve.cgroup_id, serve.off_task_mm) == (1, 7, 1)
    assert knobs.config(KernelOptions(filtered=True, has_delete=True, hold=True)).hold == 0


def test_history_values_are_cut_to_the_depth():
    spec = progcache.MapSpec("history", 1, 16, C.sizeof(abi.hist_val_type()), 8, 1, 3, 4)
    other = progcache.MapSpec("objs", 1, 16, 64, 8, 1, 5, 6)
    cut = history_sized(progcache.Layout("k", (spec, other), {}), 16)
    assert cut.maps[0].value_size == C.sizeof(abi.hist_val_type(16)) < spec.value_size
    assert (cut.maps[0].btf_key, cut.maps[0].btf_value) == (0, 0)  # BTF has the compiled size
    assert cut.maps[1] == other
    assert history_sized(progcache.Layout("k", (spec,), {}), abi.HISTORY_DEPTH).maps == (spec,)
    assert HISTORY_DEPTH.high == abi.HISTORY_DEPTH  # --history-depth's range


def test_file_identity_changes_with_the_file(tmp_path):
    f = tmp_path / "libbcc.so"
    f.write_bytes(b"one")
    first = progcache.file_identity(f)
    f.write_bytes(b"three")
    assert progcache.file_identity(f) != first
    assert progcache.file_identity(tmp_path / "gone").endswith("missing")


def layout(sizes: dict[str, str]) -> progcache.Layout:
    maps = (progcache.MapSpec("objs", 1, 16, 64, int(sizes["MAX_OBJECTS"]), 1, 3, 4),
            progcache.MapSpec("events", 27, 0, 0, int(sizes["RINGBUF_PAGES"]) * 4096, 0),
            progcache.MapSpec("stats", 6, 4, 8, 40, 0))
    return progcache.Layout("k" * 64, maps, sizes, b"\x9f\xeb\x01\x00btf")


def test_a_layout_round_trips_and_a_bad_one_is_ignored(tmp_path):
    kept = layout({"MAX_OBJECTS": "1024", "RINGBUF_PAGES": "8"})
    progcache.store_layout(tmp_path, kept)
    assert progcache.load_layout(tmp_path, "k" * 64) == kept
    assert progcache.load_layout(tmp_path, "j" * 64) is None
    path = progcache.entry_path(tmp_path, "k" * 64, "layout-")
    data = json.loads(path.read_text())
    data["body"]["maps"][0][4] = 99  # edited without its digest
    path.write_text(json.dumps(data))
    assert progcache.load_layout(tmp_path, "k" * 64) is None


def test_other_sizes_are_derived_from_the_declarations(monkeypatch):
    """A changed sizing macro that is exactly some maps' declared size resizes them
    (the ring buffer in pages); anything else is left to a maps-only compile."""
    old = layout({"MAX_OBJECTS": "1024", "RINGBUF_PAGES": "8"})
    new = resized(old, {"MAX_OBJECTS": "4096", "RINGBUF_PAGES": "16"})
    assert new is not None
    sizes = {m.name: m.max_entries for m in new.maps}
    assert sizes == {"objs": 4096, "events": 16 * 4096, "stats": 40}
    assert new.btf == old.btf and new.maps[0].btf_key == 3
    assert resized(old, old.sizes) is old
    assert resized(old, {"MAX_OBJECTS": "lots", "RINGBUF_PAGES": "8"}) is None
    monkeypatch.setitem(abi.MAPS, "twice", ("int", "__u64", "MAX_OBJECTS * 2"))
    assert resized(old, {"MAX_OBJECTS": "4096", "RINGBUF_PAGES": "8"}) is None


def test_every_sizing_flag_of_the_real_program_is_a_plain_map_size():
    """Otherwise every new --max-objects or probe count would cost a maps-only compile."""
    text = program_text()
    opts = KernelOptions(filtered=False, has_delete=True, sites=True, history=("all",),
                                unwind_offsets={"OFF_X": 1})
    sizes = progcache.sizing_flags(text, bpf_cflags(opts, 16))
    declared = {size for _, _, size in abi.MAPS.values()}
    assert set(sizes) >= {"MAX_OBJECTS", "MAX_PROBES", "RINGBUF_PAGES"}
    assert set(sizes) <= declared, set(sizes) - declared


def test_the_key_is_the_same_from_any_thread():
    """The early compile computes the key in a thread while the main thread analyses the
    binary; a key that depended on lazily filled global state (sysconfig's table) named
    no libbcc one start in eight, and the next start missed the cache (CI saw 6 tests
    fail that way).  Fresh interpreters, so nothing is warmed up before the race."""
    code = (
        "import sys, threading\n"
        "from refcntd.kernel.program import _toolchain\n"
        "out = []\n"
        "ts = [threading.Thread(target=lambda: out.append(repr(_toolchain()))) for _ in range(8)]\n"
        "[t.start() for t in ts]\n"
        "import sysconfig; sysconfig.get_config_vars()\n"
        "[t.join() for t in ts]\n"
        "print(len(set(out)), out[0])\n")
    seen = set()
    for _ in range(6):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True)
        distinct, key = done.stdout.split(" ", 1)
        assert distinct == "1", done.stdout
        seen.add(key)
    assert len(seen) == 1, seen

"""Stacks through code without frame pointers (CFI unwinding in BPF), and how
each stack says it was obtained.  Fixtures are built like Debian builds:
-O2 -fomit-frame-pointer, stubs included.

Runs use --no-leak-kinds: the subject here is unwinding; what the fixtures leak is often
still reachable at exit (kept in a global, or a pointer left on a stack), which the
default lists without failing.
"""

from __future__ import annotations

import os
import subprocess

from conftest import EXAMPLES, FIXTURES, ROOT, cc, refcntd
from test_run import lib_spec

RUN = ["run", "--no-leak-kinds"]  # the module docstring says why

NOFP = ["-O2", "-fomit-frame-pointer"]


def functions(stack: list[dict]) -> list[str]:
    return [f.get("function", "") for f in stack]


def test_library_and_program_without_frame_pointers(bpf, tmp_path):
    lib = cc(tmp_path / "lib" / "libdeep.so", [FIXTURES / "deeplib.c", EXAMPLES / "refcnt.c"],
             [*NOFP, "-fPIC", "-shared"])
    exe = cc(tmp_path / "deepmain", [FIXTURES / "deepmain.c"],
             [*NOFP, f"-L{lib.parent}", "-ldeep", f"-Wl,-rpath,{lib.parent}"])
    result = refcntd([*RUN, "--spec", str(lib_spec(tmp_path, lib)), "--", str(exe)],
                     tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    assert sum(g["objects"] for g in process["groups"]) == 2
    for group in process["groups"]:  # main calls app_setup at two places: two stacks
        names = functions(group["stack"])
        assert names[:7] == ["__refcnt__init", "gadget_alloc", "gadget_build", "gadget_new",
                             "app_make", "app_setup", "main"], group["stack"]
        assert group["stack"][3]["module"] == str(lib.resolve())
        assert group["stack"][6]["module"] == str(exe.resolve())
        assert group["unwind"] == {"method": "CFI unwind tables"}, group["unwind"]
        assert not group["stack_truncated"]
    assert result.report["tracing"]["complete"], result.report["tracing"]
    assert "truncated" not in result.stdout


def test_anomaly_stack_through_a_library_without_frame_pointers(bpf, tmp_path):
    lib = cc(tmp_path / "lib" / "libdeep.so", [FIXTURES / "deeplib.c", EXAMPLES / "refcnt.c"],
             [*NOFP, "-fPIC", "-shared"])
    exe = cc(tmp_path / "deepmain", [FIXTURES / "deepmain.c"],
             [*NOFP, f"-L{lib.parent}", "-ldeep", f"-Wl,-rpath,{lib.parent}"])
    result = refcntd([*RUN, "--spec", str(lib_spec(tmp_path, lib)), "--", str(exe), "twice"],
                     tmp_path / "r.json")
    (process,) = result.report["processes"]
    (anomaly,) = [a for a in process["anomalies"] if not a["separate"]]
    assert anomaly["kind"] == "double-put", anomaly
    assert functions(anomaly["stack"])[:4] == ["__refcnt__put", "gadget_release", "app_drop",
                                               "main"], anomaly["stack"]
    assert functions(anomaly["alloc_stack"])[:5] == ["__refcnt__init", "gadget_alloc",
                                                     "gadget_build", "gadget_new", "main"]


def test_usdt_probe_in_a_library_without_frame_pointers(bpf, build, tmp_path):
    out, probes = build.usdt_objects("-O2")
    flags = [*NOFP, f"-I{out}", f"-I{FIXTURES}"]
    lib = cc(tmp_path / "nofp" / "libwidget.so", [FIXTURES / "widget.c", probes],
             [*flags, "-fPIC", "-shared"])
    exe = cc(tmp_path / "nofp" / "widgetmain", [FIXTURES / "widgetmain.c"],
             [*flags, f"-L{lib.parent}", "-lwidget", f"-Wl,-rpath,{lib.parent}"])
    spec = tmp_path / "usdt-lib.yaml"
    spec.write_text((ROOT / "configs/specs/example-usdt.yaml").read_text()
                    .replace("roles:\n", f"library: {lib}\nroles:\n"))
    result = refcntd([*RUN, "--spec", str(spec), "--", str(exe)], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    assert sorted(i["count"] for g in process["groups"] for i in g["instances"]) == [1, 2]
    for group in process["groups"]:
        names = functions(group["stack"])
        assert "work" in names and "main" in names, group["stack"]  # callers in the program
        work = group["stack"][names.index("work")]
        assert work["module"] == str(exe.resolve())
        assert group["unwind"]["method"] in ("CFI unwind tables", "frame pointers and CFI")


def test_dlclosed_library_frames_named_host_without_frame_pointers(bpf, build, tmp_path):
    """A dlclose'd plugin's frames are named after their file.  The host, which maps
    the probed library, is held at the plugin's mmap until the plugin's table is in
    the kernel (hold.h), so its first object's stack is walked by CFI all through
    (before the holds, the plugin was stepped by its frame pointers)."""
    lib = cc(tmp_path / "stubs" / "librefcnt.so", [EXAMPLES / "refcnt.c"],
             [*NOFP, "-fPIC", "-shared"])
    plugin = cc(tmp_path / "plugins" / "libplugin.so", [FIXTURES / "plugin.c"],
                ["-O2", "-fno-omit-frame-pointer", "-fPIC", "-shared", f"-L{lib.parent}",
                 "-lrefcnt", f"-Wl,-rpath,{lib.parent}"])
    host = cc(tmp_path / "dlhost", [FIXTURES / "dlhost.c"], [*NOFP, "-ldl"])
    result = refcntd([*RUN, "--spec", str(lib_spec(tmp_path, lib)), "--", str(host),
                      str(plugin)], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    (group,) = process["groups"]
    names = functions(group["stack"])
    assert names[:4] == ["__refcnt__init", "widget_new", "plugin_run", "main"], group["stack"]
    assert group["stack"][1]["module"] == str(plugin.resolve())
    assert group["stack"][1].get("file", "").endswith("plugin.c")
    assert group["unwind"]["method"] == "CFI unwind tables"
    assert any("unwind tables were loaded" in n for n in result.report["tracing"]["notes"])


def test_every_stack_says_where_and_why_it_was_cut(bpf, tmp_path):
    """A library with neither frame pointers nor unwind tables: allocation, anomaly and
    history stacks all stop in it, and each says so (JSON and text), counted once each."""
    lib = cc(tmp_path / "lib" / "libdeep.so", [FIXTURES / "deeplib.c", EXAMPLES / "refcnt.c"],
             [*NOFP, "-fno-asynchronous-unwind-tables", "-fno-unwind-tables", "-fPIC",
              "-shared"])
    subprocess.run(["strip", "--strip-debug", str(lib)], check=True)  # -g's .debug_frame
    exe = cc(tmp_path / "deepmain", [FIXTURES / "deepmain.c"],
             [*NOFP, f"-L{lib.parent}", "-ldeep", f"-Wl,-rpath,{lib.parent}"])
    # a fresh cache: a table compiled from the unstripped build (same build-id) would be used
    env = {**os.environ, "REFCNTD_CACHE": str(tmp_path / "cache")}
    result = refcntd([*RUN, "--history", "--spec", str(lib_spec(tmp_path, lib)), "--",
                      str(exe), "twice"], tmp_path / "r.json", env=env)
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    no_table = "neither frame pointers nor an unwind table"
    cut = []
    for group in process["groups"]:
        cut.append(group["unwind"])
        cut += [step["unwind"] for i in group["instances"] for step in i["history"]]
    (anomaly,) = [a for a in process["anomalies"] if not a["separate"]]
    cut += [anomaly["unwind"], anomaly["alloc_unwind"]]
    assert len(cut) >= 5
    for unwind in cut:
        assert no_table in unwind.get("reason", ""), unwind
        assert unwind["truncated_at"] >= 1, unwind
    assert result.stderr.count("(stack truncated at frame 1: ") >= 5, result.stderr
    notes = result.report["tracing"]["notes"]
    (note,) = [n for n in notes if no_table in n]
    cut_count = int(note.split()[0])
    assert result.report["tracing"]["stacks_cut"] == cut_count >= 5, result.report["tracing"]
    # the headline says it too: a complete run is not claimed without the count
    assert f"nothing lost, {cut_count} stacks cut short (see the notes)" in result.stderr


def test_stack_through_pending_return_probes(bpf, tmp_path):
    """Constructors returning the object are return-probed: the kernel replaced
    bag_new's and box_new's return addresses with its trampoline, outside every
    executable mapping; the stack at part_new's return (under both) still reaches
    main, through the original return addresses the kernel keeps."""
    lib = cc(tmp_path / "lib" / "libchain.so", [FIXTURES / "uretchain.c"],
             [*NOFP, "-fPIC", "-shared", "-DCHAIN_LIB"])
    exe = cc(tmp_path / "chainmain", [FIXTURES / "uretchain.c"],
             [*NOFP, f"-L{lib.parent}", "-lchain", f"-Wl,-rpath,{lib.parent}"])
    spec = tmp_path / "chain.yaml"
    spec.write_text(f"version: 1\nname: uretchain\nlibrary: {lib}\nroles:\n  init:\n"
                    + "".join(f"    - functions: [{f}]\n      object: return\n"
                              f"      type: {{name: {t}}}\n"
                              for f, t in [("bag_new", "Bag"), ("box_new", "Box"),
                                           ("part_new", "Part")])
                    + "  get:\n    - functions: [part_ref]\n      object: arg1\n"
                    "  put:\n    - functions: [part_unref]\n      object: arg1\n")
    env = {**os.environ, "REFCNTD_PROBE_MODE": "entry"}  # uretprobes, not return sites
    result = refcntd([*RUN, "--spec", str(spec), "--", str(exe)], tmp_path / "r.json",
                     env=env)
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    (part,) = [g for g in process["groups"] if g["type"] == "Part"]
    assert functions(part["stack"]) == ["box_new_ex", "bag_new", "make", "main",
                                        "__libc_start_call_main", "__libc_start_main_impl",
                                        "_start"], part["stack"]
    assert not part["stack_truncated"], part["unwind"]
    assert "outside every executable mapping" not in result.stdout + result.stderr


def test_a_guess_reading_a_zero_return_address_is_a_cut_not_the_end(bpf, tmp_path):
    """Stepping by frame pointers in a module that has none is a guess: one that reads
    a return address of 0 (rbp pointed at zeros) says the stack was cut there, as a
    guess that fails to read does, not that it reached its outermost frame."""
    exe = cc(tmp_path / "zeroframe", [FIXTURES / "zeroframe.c", EXAMPLES / "refcnt.c"],
             [*NOFP, "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"])
    subprocess.run(["strip", "--strip-debug", str(exe)], check=True)  # -g's .debug_frame
    env = {**os.environ, "REFCNTD_CACHE": str(tmp_path / "cache")}  # no table of the -g build
    result = refcntd([*RUN, "--", str(exe)], tmp_path / "r.json", env=env)
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    (group,) = process["groups"]
    assert functions(group["stack"])[:2] == ["__refcnt__init", "zero_frame_new"]
    assert "neither frame pointers nor an unwind table" in group["unwind"].get("reason", ""), \
        group["unwind"]

"""The real codebases: how each is prepared, built, run and counted.

perf: tools/perf of Debian's linux-source-6.12, with the committed
perf/refcnt-stubs.patch (the 2015 refcnt debugger's noinline stubs in the
get/put/new/delete functions of dso, map, maps, thread, nsinfo and
comm_str), built -O2 -g with frame pointers; refcntd's default spec
(perf-stubs).  gstreamer: Debian's gstreamer1.0 source (`apt-get source`),
GStreamer core, its base library and core elements, built -O2 -g
(debugoptimized) with frame pointers against Debian's GLib; the bundled
gstreamer spec pointed at the built libgstreamer.  fontconfig: see fonts.py;
xkbcommon: see xkb.py; dbus: libdbus.py; xkbregistry (libxkbcommon batch 2):
xkbreg.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import cairo
import debian
import fonts
import glibcb
import harfbuzz
import libdbus
import tracefs
import truth
import xkb
import xkbreg
from codebase import Codebase, Workload, debian_meson
from sites import Api

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LIBGOBJECT = Path("/usr/lib/x86_64-linux-gnu/libgobject-2.0.so.0")


# ---- perf -----------------------------------------------------------------

PERF_PACKAGES = ["linux-source-6.12", "bison", "flex", "libelf-dev", "zlib1g-dev", "make",
                 "gcc", "binutils"]
PERF_MEMBERS = ["tools", "include", "arch/x86", "arch/arm64/tools", "arch/arm64/include",
                "scripts", "lib", "Makefile"]
PERF_FLAGS = ["DEBUG=1", "EXTRA_CFLAGS=-O2 -g -DNDEBUG=1"] + [f"NO_{f}=1" for f in (
    "LIBTRACEEVENT JEVENTS LIBPYTHON LIBPERL GTK2 SLANG LIBBPF BPF_SKEL LIBUNWIND "
    "LIBDW_DWARF_UNWIND DWARF LIBDW DEMANGLE LIBCRYPTO LIBNUMA LIBAUDIT LIBCAP LIBBABELTRACE "
    "LIBZSTD LZMA LIBDEBUGINFOD CAPSTONE LIBPFM4 LIBLLVM SDT AUXTRACE LIBAIO").split()]
PERF_TYPES = ("dso", "map", "maps", "thread", "nsinfo", "comm_str")
PERF_GETS = frozenset(f"{t}__get" for t in PERF_TYPES)
PERF_PUTS = frozenset({f"{t}__put" for t in PERF_TYPES}
                      | {f"{t}__zput" for t in ("dso", "map", "maps", "thread", "nsinfo")})
# perf record's input for the report/buildid workloads, recorded once per machine (per
# --out), at MUTANTS_PERF_FREQ samples per second (default 2000): issue 41's callchain
# sites run once per sample, and a mutant there leaks one object per sample
PERF_FREQ = os.environ.get("MUTANTS_PERF_FREQ", "2000")
PERF_RECORD = ("for i in 1 2 3 4 5; do ls -lR /usr/include > /dev/null; "
               "python3 -c 'import json; json.dumps(list(range(100000)))'; done")
# perf test cases that run in-process, read no live /proc and leak nothing unmutated
PERF_TESTS = ("8", "24", "25", "30", "31", "33", "51", "61")


def perf(out: Path) -> Codebase:
    work = out / "perf"
    src = work / "linux-source-6.12"
    build = work / "build"
    perf_bin = build / "perf"
    data = work / "work.data"
    root = src / "tools" / "perf"
    api = Api(PERF_GETS, PERF_PUTS, {n: "lvalue" for n in PERF_PUTS if "zput" in n},
              {n: n.split("__")[0] for n in PERF_GETS | PERF_PUTS})
    targets = ({n: "get" for n in PERF_GETS} | {n: "put" for n in PERF_PUTS}
               | {"__refcnt__get": "get", "__refcnt__put": "put"})
    report = (str(perf_bin), "report", "-i", str(data), "--stdio", "-g", "none",
              "--no-children")
    return Codebase(
        "perf", work, root, build, api, targets, ["**/*.c"], [perf_bin],
        [Workload("perf report", report),
         Workload("perf test", (str(perf_bin), "test", "-F", *PERF_TESTS)),
         Workload("perf buildid-list", (str(perf_bin), "buildid-list", "-i", str(data),
                                        "--with-hits")),
         # issue 41: every site the three above run was mutated by earlier waves; these
         # run callchain and sample-printing code, sites no rule was tuned on
         # (perf script first: a site both run is mutated under the faster one)
         Workload("perf script", (str(perf_bin), "script", "-i", str(data))),
         Workload("perf report -g", (str(perf_bin), "report", "-i", str(data), "--stdio",
                                     "-g", "graph,0.5,caller", "--children"))],
        REPO / "configs" / "specs" / "perf-stubs.yaml",
        build_cmd=["make", "-s", "-C", str(root), "-j2", f"O={build}", *PERF_FLAGS])


def prepare_perf(cb: Codebase, version: str = "6.12", patch: str = "refcnt-stubs.patch"
                 ) -> None:
    """Debian's linux-source-VERSION's tools/perf with the stubs PATCH, built and a
    recording made (perf61.py prepares perf 6.1 the same way)."""
    package = f"linux-source-{version}"
    debian.install([package, *PERF_PACKAGES[1:]])
    src = cb.source.parent.parent
    steps: dict[str, object] = {"packages": {package: debian.version(package)},
                                "record_freq": PERF_FREQ}
    if not (src / "Makefile").exists():
        cb.work.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        subprocess.run(["tar", "-xJf", f"/usr/src/{package}.tar.xz", "-C", str(cb.work)]
                       + [f"{package}/{m}" for m in PERF_MEMBERS], check=True)
        steps["extract_s"] = round(time.monotonic() - t, 1)
    marker = src / ".refcnt-stubs-applied"
    if not marker.exists():
        subprocess.run(["patch", "-p1", "-s", "-i", str(HERE / "perf" / patch)], cwd=src,
                       check=True)
        marker.write_text(f"benchmarks/mutants/perf/{patch}\n")
    cb.build_dir.mkdir(parents=True, exist_ok=True)
    fresh = not (cb.build_dir / "perf").exists()
    steps["build_s" if fresh else "rebuild_check_s"] = cb.build()
    steps["build_command"] = " ".join(cb.build_cmd)
    data = cb.work / "work.data"
    if not data.exists():
        subprocess.run([str(cb.build_dir / "perf"), "record", "-q", "-g", "-F", PERF_FREQ, "-o",
                        str(data), "--", "sh", "-c", PERF_RECORD], check=True,
                       stdout=subprocess.DEVNULL)
    cb.prepared = steps


def perf_probes(cb: Codebase) -> tuple[list[tracefs.Probe], dict[str, truth.Rule]]:
    """The stubs' entries: `push %rbp` (emulated), the arguments still in their registers."""
    from coverage import symbol_offsets
    binary = cb.binaries[0]
    at = symbol_offsets(binary, ["__refcnt__init", "__refcnt__get", "__refcnt__put",
                                 "refcnt__delete"])
    probes = [tracefs.Probe("init", str(binary), at["__refcnt__init"],
                            "obj=%dx:x64 n=%si:s32 name=+0(%cx):string"),
              tracefs.Probe("get", str(binary), at["__refcnt__get"], "obj=%si:x64"),
              tracefs.Probe("put", str(binary), at["__refcnt__put"], "obj=%si:x64"),
              tracefs.Probe("delete", str(binary), at["refcnt__delete"], "obj=%di:x64")]
    rules = {"init": truth.Rule(truth.INIT), "get": truth.Rule(truth.GET),
             "put": truth.Rule(truth.PUT), "delete": truth.Rule(truth.DELETE)}
    return probes, rules


# ---- GStreamer ------------------------------------------------------------

GST_PACKAGES = ["meson", "ninja-build", "bison", "flex", "libglib2.0-dev", "pkg-config",
                "dpkg-dev"]
GST_MINI = ("mini_object", "caps", "query", "memory", "message", "tag_list", "event", "buffer",
            "context", "buffer_list", "sample", "promise", "uri", "toc", "toc_entry")
GST_CLEAR_MINI = ("mini_object", "caps", "query", "message", "tag_list", "event", "buffer",
                  "buffer_list", "uri")
GST_GETS = frozenset({f"gst_{t}_ref" for t in GST_MINI} | {"gst_object_ref", "g_object_ref"})
GST_CLEARS = {f"gst_clear_{t}": "pointer" for t in GST_CLEAR_MINI} | {
    "gst_clear_object": "pointer", "g_clear_object": "pointer"}
GST_PUTS = frozenset({f"gst_{t}_unref" for t in GST_MINI} | {"gst_object_unref",
                                                             "g_object_unref"} | set(GST_CLEARS))
# GstObject functions (their first argument the object) at which the spec reads the
# "may be leaked" flag (GstObject.flags at +48); they change no count themselves
GST_FLAG_CHECKS = ("gst_object_ref", "gst_object_unref", "gst_object_ref_sink",
                   "gst_object_set_parent", "gst_object_unparent")
GST_GOBJECT = {"gst_object_ref", "g_object_ref", "gst_object_unref", "g_object_unref",
               "gst_clear_object", "g_clear_object"}
GST_MESON = ["--buildtype=debugoptimized", "-Dc_args=-fno-omit-frame-pointer",
             "-Dtests=disabled", "-Dexamples=disabled", "-Dbenchmarks=disabled",
             "-Dintrospection=disabled", "-Ddoc=disabled", "-Dnls=disabled",
             "-Dlibunwind=disabled", "-Dlibdw=disabled", "-Dbash-completion=disabled",
             "-Dtools=enabled", "-Dcoretracers=disabled", "-Dcheck=disabled",
             "-Dptp-helper-permissions=none"]
GST_SCAN_DIRS = ("gst", "libs/gst/base", "plugins/elements")
# The workload: GStreamer's own gst-launch-1.0 on pipelines of the core elements, one
# process each (a mutant runs the first pipeline that executes its site).  Each ends by
# itself (num-buffers, end of file), with no randomness.
GPL = "/usr/share/common-licenses/GPL-2"
GST_PIPELINES = {
    "tee+queues": "fakesrc num-buffers=100 sizetype=2 sizemax=4096 filltype=2 ! identity "
                  "! tee name=t ! queue ! fakesink t. ! queue ! fakesink",
    "funnel": "fakesrc num-buffers=50 ! capsfilter caps=application/x-test ! valve "
              "! funnel name=f ! fakesink fakesrc num-buffers=50 ! f.",
    "dataurisrc": "dataurisrc uri=data:,Hello%20mutants ! filesink location=/dev/null",
    "queue2+multiqueue": f"filesrc location={GPL} blocksize=512 ! queue2 ! multiqueue "
                         "! fakesink",
    "output-selector": "fakesrc num-buffers=20 ! output-selector name=os os.src_0 "
                       "! fakesink os.src_1 ! fakesink async=false",
    "input-selector": "fakesrc num-buffers=20 ! is.sink_0 input-selector name=is ! fakesink",
    "concat": "concat name=c ! fakesink fakesrc num-buffers=10 ! c. fakesrc num-buffers=10 ! c.",
    "clocksync": "fakesrc num-buffers=10 ! clocksync ! identity ! fakesink",
    "fdsrc": "fdsrc fd=0 ! fdsink fd=1",
}


# Added after the single-run rules were changed on fontconfig (issue 41), so that the
# sites only these run are held out: -v's property notifications, a leaky queue, a bin
# in the pipeline's description, a live source synced to the clock, a tee with an
# unlinked branch allowed; gst-inspect on a plugin and on an element (the registry,
# plugin features, pad templates)
GST_HELD_OUT = {
    "-v": "-v fakesrc num-buffers=5 ! fakesink",
    "leaky queue": "fakesrc num-buffers=200 ! queue leaky=downstream max-size-buffers=2 "
                   "! fakesink sync=false",
    "bin": "bin. '(' fakesrc num-buffers=10 ! identity ')' ! fakesink",
    "live sync": "fakesrc num-buffers=20 is-live=true ! fakesink sync=true",
    "tee not linked": "fakesrc num-buffers=10 ! tee allow-not-linked=true name=t t. ! queue "
                      "! fakesink",
}
GST_INSPECT = ("coreelements", "queue2")


def gstreamer(out: Path) -> Codebase:
    work = out / "gstreamer"
    build = work / "build"
    api = Api(GST_GETS, GST_PUTS, GST_CLEARS,
              {n: "GObject" if n in GST_GOBJECT else "GstMiniObject" for n in GST_GETS | GST_PUTS})
    targets = ({n: "get" for n in GST_GETS} | {n: "put" for n in GST_PUTS})
    binaries = [build / "gst" / "libgstreamer-1.0.so.0",
                build / "libs" / "gst" / "base" / "libgstbase-1.0.so.0",
                build / "plugins" / "elements" / "libgstcoreelements.so"]
    env = {"GST_REGISTRY_1_0": str(work / "registry.bin"),
           "GST_PLUGIN_SYSTEM_PATH_1_0": "", "GST_PLUGIN_PATH_1_0": str(build / "plugins"),
           "GST_PLUGIN_SCANNER_1_0": str(build / "libs/gst/helpers/gst-plugin-scanner"),
           "GST_REGISTRY_FORK": "no", "GST_REGISTRY_UPDATE": "no", "GST_DEBUG": "0"}
    return Codebase(
        "gstreamer", work, work / "src", build, api, targets,
        [f"{d}/*.c" for d in GST_SCAN_DIRS], binaries,
        [*(gst_launch(build, label, pipeline) for label, pipeline in
           (GST_PIPELINES | GST_HELD_OUT).items()),
         *(Workload(f"gst-inspect {what}", ("/bin/sh", "-c", f"exec {build}/tools/gst-inspect-1.0"
                                            f" {what} > /dev/null")) for what in GST_INSPECT)],
        work / "gstreamer-built.yaml", env=env, build_cmd=["ninja", "-C", str(build)])


def gst_launch(build: Path, label: str, pipeline: str) -> Workload:
    launch = f"exec {build / 'tools' / 'gst-launch-1.0'} -q {pipeline}"
    if label == "fdsrc":  # stdin and stdout are files
        launch += f" < {GPL} > /dev/null"
    return Workload(f"gst-launch {label}", ("/bin/sh", "-c", launch))


def prepare_gstreamer(cb: Codebase) -> None:
    debian.install(GST_PACKAGES)
    steps = debian_meson(cb, "gstreamer1.0", GST_MESON)
    spec = (REPO / "configs" / "specs" / "gstreamer.yaml").read_text()
    cb.spec.write_text(spec.replace("library: libgstreamer-1.0.so.0",
                                    f"library: {cb.binaries[0]}"))
    registry = Path(cb.env["GST_REGISTRY_1_0"])
    if not registry.exists():  # built once, then never updated (GST_REGISTRY_UPDATE=no)
        env = {**cb.run_env(), "GST_REGISTRY_UPDATE": "yes"}
        subprocess.run([str(cb.build_dir / "tools" / "gst-inspect-1.0")], env=env, check=True,
                       stdout=subprocess.DEVNULL)
    cb.prepared = steps


def gstreamer_probes(cb: Codebase) -> tuple[list[tracefs.Probe], dict[str, truth.Rule]]:
    from coverage import symbol_offsets
    gst = cb.binaries[0].resolve()
    gobject = LIBGOBJECT.resolve()
    at = symbol_offsets(gst, ["gst_mini_object_init", "gst_mini_object_ref",
                              "gst_mini_object_unref", *GST_FLAG_CHECKS])
    go = symbol_offsets(gobject, ["g_object_new_valist", "g_object_new_with_properties",
                                  "g_object_newv", "g_object_ref", "g_object_unref",
                                  "g_type_free_instance"])
    probes = [tracefs.Probe("mo_init", str(gst), at["gst_mini_object_init"], "obj=%di:x64"),
              # the "may be leaked" flag: GstMiniObject.flags at +16
              tracefs.Probe("mo_ref", str(gst), at["gst_mini_object_ref"],
                            "obj=%di:x64 fl=+16(%di):x32"),
              tracefs.Probe("mo_unref", str(gst), at["gst_mini_object_unref"],
                            "obj=%di:x64 fl=+16(%di):x32"),
              tracefs.Probe("go_ref", str(gobject), go["g_object_ref"], "obj=%di:x64"),
              tracefs.Probe("go_unref", str(gobject), go["g_object_unref"], "obj=%di:x64"),
              tracefs.Probe("go_free", str(gobject), go["g_type_free_instance"], "obj=%di:x64")]
    # the flag read where the spec reads it: a pad template is flagged at its init and
    # ref-sunk by its element class, never passing gst_object_ref/unref again
    probes += [tracefs.Probe(f"gst_chk{i}", str(gst), at[f], "obj=%di:x64 fl=+48(%di):x32")
               for i, f in enumerate(GST_FLAG_CHECKS)]
    probes += [tracefs.Probe(f"go_new{i}", str(gobject), go[f], "obj=$retval:x64", ret=True)
               for i, f in enumerate(("g_object_new_valist", "g_object_new_with_properties",
                                      "g_object_newv"))]
    rules = {"mo_init": truth.Rule(truth.INIT, "GstMiniObject"),
             "mo_ref": truth.Rule(truth.GET, flag=4),
             "mo_unref": truth.Rule(truth.PUT_FREES, flag=4),
             "go_ref": truth.Rule(truth.GET), "go_unref": truth.Rule(truth.PUT),
             "go_free": truth.Rule(truth.DELETE)}
    rules |= {f"go_new{i}": truth.Rule(truth.INIT_RETURN, "GObject") for i in range(3)}
    rules |= {f"gst_chk{i}": truth.Rule(truth.CHECK, flag=1) for i in range(len(GST_FLAG_CHECKS))}
    return probes, rules


CODEBASES = {"perf": (perf, prepare_perf, perf_probes),
             "gstreamer": (gstreamer, prepare_gstreamer, gstreamer_probes),
             "fontconfig": (fonts.codebase, fonts.prepare, fonts.probes),
             "xkbcommon": (xkb.codebase, xkb.prepare, xkb.probes),
             "dbus": (libdbus.codebase, libdbus.prepare, libdbus.probes),
             "xkbregistry": (xkbreg.codebase, xkbreg.prepare, xkbreg.probes),
             "glib": (glibcb.codebase, glibcb.prepare, glibcb.probes),
             "harfbuzz": (harfbuzz.codebase, harfbuzz.prepare, harfbuzz.probes),
             "cairo": (cairo.codebase, cairo.prepare, cairo.probes)}
# perf 6.1 (issue 55's judge, never measured for a rule): perf61.py, registered there


def load(name: str, out: Path, prepare: bool = True) -> Codebase:
    make, prep, _ = CODEBASES[name]
    cb = make(out)
    if prepare:
        prep(cb)
    return cb


def probes(cb: Codebase) -> tuple[list[tracefs.Probe], dict[str, truth.Rule]]:
    return CODEBASES[cb.name][2](cb)


def restore_all(cb: Codebase) -> list[str]:
    """Put back every file a stopped run left mutated (its pristine copy differs);
    returns their names.  Without this the next build is a mutant's, baselines included."""
    pristine = cb.work / "pristine"
    changed = []
    for copy in sorted(p for p in pristine.rglob("*") if p.is_file()) if pristine.exists() else []:
        rel = str(copy.relative_to(pristine))
        if (cb.source / rel).read_bytes() != copy.read_bytes():
            (cb.source / rel).write_bytes(copy.read_bytes())
            changed.append(rel)
    return changed


def keep_pristine(cb: Codebase, rel: str) -> Path:
    """A copy of the unmutated file, made once; the mutants restore from it."""
    copy = cb.work / "pristine" / rel
    if not copy.exists():
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(cb.source / rel, copy)
    return copy

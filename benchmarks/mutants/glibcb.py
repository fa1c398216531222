"""GLib/GObject 2.74 itself as a codebase of the mutant benchmark (issue 55).

Debian 12's glib2.0 source (`apt-get source glib2.0`, 2.74.6 with Debian's
patches), built with meson debugoptimized (-O2 -g) and frame pointers (tests,
man pages, docs, NLS, sysprof, dtrace off), never installed.  The mutated code
is the built libglib-2.0, libgobject-2.0 and libgio-2.0 and GLib's own tools
from the same tree (`gio`, `gresource`, `glib-compile-resources`,
`glib-compile-schemas`, `gsettings`), which find the built libraries through
meson's build rpath.  No GIO module of the machine is loaded (GIO_MODULE_DIR is
an empty directory: Debian's modules link Debian's GLib), files go through the
local VFS, settings through the memory backend.

The API: GObject's g_object_ref/g_object_ref_sink/g_object_unref/g_clear_object
and GLib's GVariant, GBytes and GHashTable ref/unref pairs (the types of the
bundled gobject and glib specs).  refcntd runs on one spec made of those two
bundled specs with their libraries pointed at the built ones.  The truth's
probes (ftrace only) are the constructors' returns, every ref and unref entry
and GObject's g_type_free_instance.

Workloads (one shell each, several tool processes, fixed inputs made by
prepare, a scratch directory emptied at the start of each run): gio
subcommands on a small file tree; glib-compile-resources and gresource on a
resource bundle; glib-compile-schemas and gsettings on a schema of its own.

The rules of refcntd's inference were not written or changed on any of this
codebase's answers (main dc0f3e0 when it was defined).  The unmutated build is not
leak-free: GLib's process-lifetime tables and singletons, and 2.74.6's `gio list`
never unrefs its GFileEnumerator (gio-tool-list.c:124); a mutant's truth is what it
leaks beyond that baseline (repeatable per workload).  The set's answers are kept out
of the tree (its SETS.md beside mutants.json), so that no rule is written on them.
"""

from __future__ import annotations

from pathlib import Path

import debian
import tracefs
import truth
import yaml
from codebase import Codebase, Workload, debian_meson
from sites import Api

REPO = Path(__file__).resolve().parent.parent.parent
PACKAGES = ["meson", "ninja-build", "pkg-config", "dpkg-dev", "libffi-dev", "libmount-dev",
            "libpcre2-dev", "zlib1g-dev"]
MESON = ["--buildtype=debugoptimized", "-Dc_args=-fno-omit-frame-pointer", "-Dtests=false",
         "-Dinstalled_tests=false", "-Dman=false", "-Dgtk_doc=false", "-Dnls=disabled",
         "-Dsysprof=disabled", "-Dlibelf=disabled", "-Ddtrace=false", "-Dsystemtap=false",
         "-Dselinux=disabled", "-Dglib_debug=disabled", "-Doss_fuzz=disabled"]
LIBS = {"glib": "glib/libglib-2.0.so.0", "gobject": "gobject/libgobject-2.0.so.0",
        "gio": "gio/libgio-2.0.so.0"}
TOOLS = ("gio", "gresource", "glib-compile-resources", "glib-compile-schemas", "gsettings")
TYPES = ("GObject", "GVariant", "GBytes", "GHashTable")
GETS = frozenset({"g_object_ref", "g_object_ref_sink", "g_variant_ref", "g_variant_ref_sink",
                  "g_bytes_ref", "g_hash_table_ref"})
CLEARS = {"g_clear_object": "pointer"}
PUTS = frozenset({"g_object_unref", "g_variant_unref", "g_bytes_unref", "g_hash_table_unref",
                  "g_hash_table_destroy", *CLEARS})
TYPE = {n: ("GObject" if n.startswith(("g_object", "g_clear_object")) else "GVariant"
            if "variant" in n else "GBytes" if "bytes" in n else "GHashTable")
        for n in GETS | PUTS}
# the callees of the call instructions the coverage counts (g_clear_object calls
# g_object_unref)
TARGETS = {**{n: "get" for n in GETS}, **{n: "put" for n in PUTS - set(CLEARS)}}

# The truth's constructors (2.74): the functions every object of a type is made in
# and returned from, once each (g_hash_table_new -> _new_full; g_bytes_new/_take/
# _static/_from_bytes -> _with_free_func; g_variant_new_<basic> -> _new_from_bytes;
# the container constructors make theirs in the internal g_variant_new_from_children).
# g_variant_get_child_value makes a child of serialised data, or refs a tree child;
# a GObject constructor may return an existing object it refs: "new unless alive".
CONSTRUCTORS = {
    "GHashTable": ("glib", ["g_hash_table_new_full"]),
    "GBytes": ("glib", ["g_bytes_new_with_free_func"]),
    "GVariant": ("glib", ["g_variant_new_from_bytes", "g_variant_new_tuple",
                          "g_variant_new_array", "g_variant_new_variant",
                          "g_variant_new_maybe", "g_variant_new_dict_entry",
                          "g_variant_builder_end", "g_variant_new_strv",
                          "g_variant_new_objv", "g_variant_new_bytestring_array",
                          "g_variant_get_child_value"]),
    "GObject": ("gobject", ["g_object_new_valist", "g_object_new_with_properties",
                            "g_object_newv"]),
}
TRUTH_GETS = {"glib": ["g_hash_table_ref", "g_bytes_ref", "g_variant_ref"],
              "gobject": ["g_object_ref"]}
# g_hash_table_destroy, g_object_ref_sink and g_variant_ref_sink call these (a probe
# each would count twice); g_bytes_unref_to_data steals the last reference's data
# without g_bytes_unref
TRUTH_PUTS = {"glib": ["g_hash_table_unref", "g_bytes_unref", "g_variant_unref",
                       "g_bytes_unref_to_data"],
              "gobject": ["g_object_unref"]}

# The workloads' inputs (prepare writes them under WORK/files) ---------------------
DATA = {"a.txt": "alpha\n" * 40, "b.bin": "\x00\x01binary\x02" * 64,
        "sub/c.txt": "gamma\n", "sub/deeper/d.txt": "delta\n" * 3,
        "page.html": "<html><body>refcntd</body></html>\n"}
RESOURCES = """<?xml version="1.0" encoding="UTF-8"?>
<gresources>
  <gresource prefix="/org/refcntd/test">
    <file>a.txt</file>
    <file compressed="true">b.bin</file>
    <file alias="c-alias.txt">sub/c.txt</file>
    <file>sub/deeper/d.txt</file>
  </gresource>
  <gresource prefix="/org/refcntd/other">
    <file compressed="true">page.html</file>
  </gresource>
</gresources>
"""
SCHEMA = """<?xml version="1.0" encoding="UTF-8"?>
<schemalist>
  <enum id="org.refcntd.test.Mode">
    <value nick="off" value="0"/>
    <value nick="fast" value="1"/>
    <value nick="slow" value="2"/>
  </enum>
  <flags id="org.refcntd.test.Flags">
    <value nick="read" value="1"/>
    <value nick="write" value="2"/>
  </flags>
  <schema id="org.refcntd.test" path="/org/refcntd/test/">
    <key name="name" type="s"><default>'refcntd'</default>
      <summary>A name</summary><description>The name of the test.</description></key>
    <key name="count" type="i"><range min="0" max="100"/><default>7</default></key>
    <key name="enabled" type="b"><default>true</default></key>
    <key name="mode" enum="org.refcntd.test.Mode"><default>'fast'</default></key>
    <key name="access" flags="org.refcntd.test.Flags"><default>['read']</default></key>
    <key name="choice" type="s"><choices><choice value="one"/><choice value="two"/>
      </choices><default>'one'</default></key>
    <key name="list" type="as"><default>['x', 'y']</default></key>
    <key name="table" type="a{su}"><default>{'k': 1}</default></key>
    <key name="pair" type="(id)"><default>(1, 2.5)</default></key>
    <child name="child" schema="org.refcntd.test.child"/>
  </schema>
  <schema id="org.refcntd.test.child" path="/org/refcntd/test/child/">
    <key name="size" type="u"><default>3</default></key>
  </schema>
  <schema id="org.refcntd.test.reloc">
    <key name="path" type="o"><default>'/'</default></key>
  </schema>
</schemalist>
"""
# (label, script): $B is the build directory, $F the inputs, $S the run's scratch
# directory (emptied first, the working directory).  Each ends by itself, with no randomness
WORKLOADS = (
    ("gio files", """cp -r $F/data $S/data; ln -s a.txt $S/data/link
G=$B/gio/gio
$G list -l -h $S/data; $G list -a 'standard::*,unix::mode' $S/data/sub
$G info $S/data/a.txt; $G info -a 'standard::,time::' $S/data/link; $G info -f $S/data
$G cat $S/data/a.txt $S/data/sub/c.txt > /dev/null
$G copy $S/data/a.txt $S/copy.txt; $G copy -p $S/data/b.bin $S/b-copy.bin
$G move $S/copy.txt $S/moved.txt; $G mkdir -p $S/new/dir; $G rename $S/data/b.bin b2.bin
$G save $S/saved.txt < $F/data/a.txt; $G set -t uint32 $S/saved.txt unix::mode 384
$G tree -h -l $S/data; $G remove $S/moved.txt; $G remove -f $S/nothing
$G list $S/no-such-dir; $G info $S/no-such-file; $G cat $S/no-such-file; true"""),
    ("gresource", """$B/gio/glib-compile-resources --sourcedir $F/data --target $S/r.gresource \
$F/res.gresource.xml
$B/gio/glib-compile-resources --sourcedir $F/data --generate-source --target $S/r.c \
$F/res.gresource.xml
$B/gio/glib-compile-resources --sourcedir $F/data --generate-header --target $S/r.h \
$F/res.gresource.xml
$B/gio/glib-compile-resources --sourcedir $F/data --generate-dependencies $F/res.gresource.xml
R=$B/gio/gresource
$R list $S/r.gresource; $R details $S/r.gresource; $R list $S/r.gresource /org/refcntd/test/sub/
$R extract $S/r.gresource /org/refcntd/test/b.bin > /dev/null
$R extract $S/r.gresource /org/refcntd/other/page.html > /dev/null
$R extract $S/r.gresource /org/refcntd/none; true"""),
    ("gsettings", """cp $F/schemas/*.xml $S/; $B/gio/glib-compile-schemas --strict $S
export GSETTINGS_SCHEMA_DIR=$S
T=$B/gio/gsettings
$T list-schemas; $T list-relocatable-schemas; $T list-keys org.refcntd.test
$T list-children org.refcntd.test; $T list-recursively org.refcntd.test
$T get org.refcntd.test table; $T get org.refcntd.test pair; $T range org.refcntd.test mode
$T range org.refcntd.test count; $T describe org.refcntd.test name
$T writable org.refcntd.test list; $T set org.refcntd.test name "'other'"
$T set org.refcntd.test list "['p', 'q', 'r']"; $T reset org.refcntd.test count
$T get org.refcntd.test.reloc:/org/refcntd/reloc/ path
$T get org.refcntd.test nokey; $T set org.refcntd.test count 1000; true"""),
)


def codebase(out: Path) -> Codebase:
    work = out / "glib"
    build = work / "build"
    files, scratch = work / "files", work / "run"
    env = {"GIO_MODULE_DIR": str(work / "no-modules"), "GIO_USE_VFS": "local",
           "GIO_USE_VOLUME_MONITOR": "unix", "GSETTINGS_BACKEND": "memory", "LC_ALL": "C.UTF-8",
           "G_MESSAGES_DEBUG": "", "XDG_DATA_DIRS": str(files / "share"),
           "XDG_DATA_HOME": str(files / "share"), "XDG_CONFIG_HOME": str(files / "config")}
    workloads = []
    for label, script in WORKLOADS:
        s = scratch / label.replace(" ", "-")
        setup = f"B={build}; F={files}; S={s}; rm -rf $S; mkdir -p $S; cd $S\n"
        workloads.append(Workload(label, ("/bin/sh", "-c", setup + script)))
    binaries = [build / LIBS[k] for k in ("gio", "gobject", "glib")]
    return Codebase(
        "glib", work, work / "src", build, Api(GETS, PUTS, CLEARS, TYPE), TARGETS,
        ["glib/*.c", "gobject/*.c", "gio/*.c"], [*binaries, *(build / "gio" / t for t in TOOLS)],
        workloads, work / "glib-built.yaml", env=env,
        build_cmd=["ninja", "-C", str(build), "-j2", *(f"{LIBS[k]}.7400.6" for k in LIBS),
                   *(f"gio/{t}" for t in TOOLS)])


def prepare(cb: Codebase) -> None:
    debian.install(PACKAGES)
    steps = debian_meson(cb, "glib2.0", MESON)
    files = cb.work / "files"
    for rel, text in DATA.items():
        (files / "data" / rel).parent.mkdir(parents=True, exist_ok=True)
        (files / "data" / rel).write_text(text)
    (files / "res.gresource.xml").write_text(RESOURCES)
    (files / "schemas").mkdir(exist_ok=True)
    (files / "schemas" / "org.refcntd.test.gschema.xml").write_text(SCHEMA)
    for d in ("share", "config"):
        (files / d).mkdir(exist_ok=True)
    (cb.work / "no-modules").mkdir(exist_ok=True)
    cb.spec.write_text(built_spec(cb))
    steps["packages"] = {"glib2.0 (source)": debian.version("glib2.0", source_package=True)}
    cb.prepared = steps


def built_spec(cb: Codebase) -> str:
    """The bundled glib and gobject specs as one, their libraries the built ones, and
    GLib's valgrind suppressions those of the built tree."""
    specs = REPO / "configs" / "specs"
    glib = yaml.safe_load((specs / "glib.yaml").read_text())
    gobject = yaml.safe_load((specs / "gobject.yaml").read_text())
    lib = {k: str(cb.build_dir / v) for k, v in LIBS.items()}
    roles: dict[str, list[dict[str, object]]] = {}
    for doc, library in ((glib, lib["glib"]), (gobject, lib["gobject"])):
        for role, entries in doc["roles"].items():
            for entry in entries if isinstance(entries, list) else [entries]:
                roles.setdefault(role, []).append({**entry, "library": library})
    supp = str(cb.source / "tools" / "glib.supp")
    kept = [{**k, "valgrind": supp} if "valgrind" in k else k
            for k in glib["kept_by_library"] + gobject["kept_by_library"]]
    kept = [k for i, k in enumerate(kept) if k not in kept[:i]]
    doc = {"version": 1, "name": "glib-built",
           "description": "GObject, GHashTable, GBytes, GVariant of the built GLib 2.74",
           "library": lib["glib"], "roles": roles, "kept_by_library": kept}
    return ("# benchmarks/mutants/glibcb.py: configs/specs/glib.yaml and gobject.yaml, "
            "their libraries the built ones\n" + yaml.safe_dump(doc, sort_keys=False))


def probes(cb: Codebase) -> tuple[list[tracefs.Probe], dict[str, truth.Rule]]:
    """The constructors' returns, the entries of every ref and unref, GObject's
    g_type_free_instance."""
    from coverage import symbol_offsets
    libs = {k: (cb.build_dir / v).resolve() for k, v in LIBS.items()}
    wanted: dict[str, list[str]] = {}
    for lib, names in CONSTRUCTORS.values():
        wanted.setdefault(lib, []).extend(names)
    for table in (TRUTH_GETS, TRUTH_PUTS):
        for lib, names in table.items():
            wanted.setdefault(lib, []).extend(names)
    wanted["gobject"].append("g_type_free_instance")
    at = {lib: symbol_offsets(libs[lib], names) for lib, names in wanted.items()}
    found: list[tracefs.Probe] = []
    rules: dict[str, truth.Rule] = {}

    def add(tag: str, lib: str, fn: str, rule: truth.Rule, ret: bool = False) -> None:
        found.append(tracefs.Probe(tag, str(libs[lib]), at[lib][fn],
                                   "obj=$retval:x64" if ret else "obj=%di:x64", ret=ret))
        rules[tag] = rule

    for type_, (lib, names) in CONSTRUCTORS.items():
        for fn in names:
            add(f"g_new{len(found)}", lib, fn, truth.Rule(truth.INIT_RETURN_NEW, type_), True)
    for lib, names in TRUTH_GETS.items():
        for fn in names:
            add(f"g_get{len(found)}", lib, fn, truth.Rule(truth.GET))
    for lib, names in TRUTH_PUTS.items():
        for fn in names:  # a GObject ends in g_type_free_instance, after its dispose
            add(f"g_put{len(found)}", lib, fn,
                truth.Rule(truth.PUT if lib == "gobject" else truth.PUT_FREES))
    add("g_free_instance", "gobject", "g_type_free_instance", truth.Rule(truth.DELETE))
    return found, rules

"""The fourth codebase: libxkbcommon 1.5, -O2, held out whole (issue 41).

Debian's libxkbcommon source (`apt-get source libxkbcommon`), built with meson
debugoptimized (-O2 -g) and frame pointers, never installed: the shared
libxkbcommon.so.0, its xkbcli tools (compile-keymap, how-to-type, the
uninstalled `compose`) and, through the committed xkbcommon/shared-tests.patch,
its unit tests that use only the public API linked against the shared library
(upstream links every test against an internal static copy, where the library's
probes would not see their objects).  The tools read the machine's xkb-data
(/usr/share/X11/xkb) and X11 Compose files (/usr/share/X11/locale); the tests
read the tree's test/data.

No rule of refcntd's inference was written or changed after reading any of this
codebase's answers: the rules are those of main 949db32 (refcntd/analysis at tree
f2974e1, last changed by 3030c8b), fixed before this module was written.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import debian
import tracefs
import truth
from codebase import Codebase, Workload, api_probes, debian_meson
from sites import Api

HERE = Path(__file__).resolve().parent
PACKAGES = ["meson", "ninja-build", "bison", "flex", "pkg-config", "dpkg-dev", "xkb-data",
            "libx11-data"]
MESON = ["--buildtype=debugoptimized", "-Dc_args=-fno-omit-frame-pointer", "--prefix=/usr",
         "-Denable-x11=false", "-Denable-wayland=false", "-Denable-docs=false",
         "-Denable-xkbregistry=false"]
TYPES = ("context", "keymap", "state", "compose_table", "compose_state")
GETS = frozenset(f"xkb_{t}_ref" for t in TYPES)
PUTS = frozenset(f"xkb_{t}_unref" for t in TYPES)
TYPE = {f"xkb_{t}_{op}": f"xkb_{t}" for t in TYPES for op in ("ref", "unref")}
# the constructors the spec names (xkbcommon/xkbcommon.yaml), the static
# xkb_compose_table_new under the name of gcc's clone of it
CONSTRUCTORS = {"xkb_context": "xkb_context_new", "xkb_keymap": "xkb_keymap_new",
                "xkb_state": "xkb_state_new",
                "xkb_compose_table": "xkb_compose_table_new.constprop.0",
                "xkb_compose_state": "xkb_compose_state_new"}
TOOLS = ("xkbcli-compile-keymap", "xkbcli-how-to-type", "compose")
TESTS = ("state", "keyseq", "compose", "keymap", "stringcomp", "buffercomp", "rulescomp",
         "filecomp")
# (label, shell command run with `exec`; BUILD and SRC are the build and source trees):
# the tools on the machine's xkb-data and Compose files, their error paths (a layout
# that does not exist, a keymap that does not parse, a locale with no Compose file),
# then the unit tests.  One process each, no randomness; every one ends by itself
WORKLOADS = (
    ("compile-keymap us", "BUILD/xkbcli-compile-keymap --layout us > /dev/null"),
    ("compile-keymap de,ru", "BUILD/xkbcli-compile-keymap --layout de,ru --variant "
     "nodeadkeys, --options grp:alt_shift_toggle,ctrl:nocaps > /dev/null"),
    ("compile-keymap no layout", "BUILD/xkbcli-compile-keymap --layout nosuchlayout"),
    ("compile-keymap --from-xkb", "BUILD/xkbcli-compile-keymap --from-xkb "
     "< SRC/test/data/keymaps/host.xkb > /dev/null"),
    ("compile-keymap --from-xkb bad", "BUILD/xkbcli-compile-keymap --from-xkb "
     "< SRC/test/data/keymaps/syntax-error.xkb"),
    ("how-to-type", "BUILD/xkbcli-how-to-type --layout de,fr 233"),
    ("how-to-type --keysym", "BUILD/xkbcli-how-to-type --keysym --layout us dead_acute"),
    ("compose en_US", "BUILD/compose --locale en_US.UTF-8"),
    ("compose no locale", "BUILD/compose --locale xx_XX.UTF-8"),
    *((f"test {t}", f"BUILD/shared-test-{t} > /dev/null") for t in TESTS),
)


def codebase(out: Path) -> Codebase:
    return tree_codebase(out, "xkbcommon", Api(GETS, PUTS, {}, TYPE), "libxkbcommon.so.0",
                         ["src/*.c", "src/compose/*.c", "src/xkbcomp/*.c", "tools/*.c",
                          "test/*.c"],
                         [*TOOLS, *(f"shared-test-{t}" for t in TESTS)], WORKLOADS)


def tree_codebase(out: Path, name: str, api: Api, library: str, sources: list[str],
                  programs: list[str], workloads: Sequence[tuple[str, str]]) -> Codebase:
    """A codebase of libxkbcommon's meson tree (both batches): `library` and `programs`
    built in its build directory, workloads' BUILD and SRC replaced by its directories."""
    work = out / name
    build, src = work / "build", work / "src"
    targets = {n: ("get" if n in api.gets else "put") for n in api.gets | api.puts}
    return Codebase(
        name, work, src, build, api, targets, sources,
        [build / library, *(build / p for p in programs)],
        [Workload(label, ("/bin/sh", "-c", "exec " + cmd.replace("BUILD", str(build))
                          .replace("SRC", str(src)))) for label, cmd in workloads],
        work / f"{name}-built.yaml",
        env={"top_srcdir": str(src), "top_builddir": str(build), "LC_ALL": "C"},
        build_cmd=["ninja", "-C", str(build), f"{library}.0.0", *programs])


def patched_build(cb: Codebase, packages: list[str], patch: str,
                  meson: list[str]) -> dict[str, object]:
    """libxkbcommon's Debian source with xkbcommon/PATCH applied (once), built; the steps."""
    debian.install(packages)
    if not cb.source.exists():
        cb.source.symlink_to(debian.source("libxkbcommon", cb.work / "debian-source"))
    marker = cb.source / f".{patch.removesuffix('.patch')}-applied"  # batch 1's name
    if not marker.exists():
        subprocess.run(["patch", "-p1", "-s", "-i", str(HERE / "xkbcommon" / patch)],
                       cwd=cb.source, check=True)
        marker.write_text(f"benchmarks/mutants/xkbcommon/{patch}\n")
    steps = debian_meson(cb, "libxkbcommon", meson)
    steps["patch"] = f"benchmarks/mutants/xkbcommon/{patch}"
    return steps


def prepare(cb: Codebase) -> None:
    steps = patched_build(cb, PACKAGES, "shared-tests.patch", MESON)
    steps["packages"] = {p: debian.version(p) for p in ("xkb-data", "libx11-data")}
    spec = (HERE / "xkbcommon" / "xkbcommon.yaml").read_text()
    cb.spec.write_text(spec.replace("library: libxkbcommon.so.0",
                                    f"library: {cb.binaries[0]}"))
    cb.prepared = steps


def probes(cb: Codebase) -> tuple[list[tracefs.Probe], dict[str, truth.Rule]]:
    """The constructors' returns, and the entries of every ref and unref."""
    return api_probes(cb.binaries[0].resolve(), CONSTRUCTORS, GETS, PUTS, "xkb")

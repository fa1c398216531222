"""libxkbcommon's second library, libxkbregistry 1.5, -O2: issue 41's libxkbcommon batch 2.

libxkbcommon batch 1 (xkb.py) mutated every site its workloads execute, and its
answers tuned the rules of b2168bf: it is no longer held out.  The same source
package (`apt-get source libxkbcommon`) also builds libxkbregistry, which
xkb.py turns off: its own refcounted objects (a context, and the models,
layouts, option groups, options and ISO 639/3166 codes it parses from the
rules' XML), the xkbcli-list tool and the registry unit test: sites and
workloads batch 1 never had, in the same codebase.

Built as xkb.py builds (meson debugoptimized, -O2 -g, frame pointers, never
installed) with xkbregistry on, plus xkbcommon/registry-noinline.patch: the
children are made by `static inline` rxkb_TYPE_create functions that gcc inlines
into the parsers, so neither the truth nor refcntd could see them made; the
patch makes them noinline (and noclone, one symbol each), as perf's stubs patch
gives perf probe points.  Nothing else changes.  The library's own calls to
its exported ref/unref go through the PLT (-fvisibility=hidden, a version script).

Written with main's rules at 1838414 (refcntd/analysis of 8bc272c, right2's
same-role rule); no rule changes on this branch.  NOT RUN YET: no site of this
set has been executed, mutated or judged; run it on the rules of the day and
say which.
"""

from __future__ import annotations

from pathlib import Path

import debian
import tracefs
import truth
import xkb
from codebase import Codebase, api_probes
from sites import Api

HERE = Path(__file__).resolve().parent
PACKAGES = [*xkb.PACKAGES, "libxml2-dev"]
MESON = [o for o in xkb.MESON if o != "-Denable-xkbregistry=false"] + [
    "-Denable-xkbregistry=true"]
TYPES = ("context", "model", "layout", "option_group", "option", "iso639_code",
         "iso3166_code")
GETS = frozenset(f"rxkb_{t}_ref" for t in TYPES)
PUTS = frozenset(f"rxkb_{t}_unref" for t in TYPES)
TYPE = {f"rxkb_{t}_{op}": f"rxkb_{t}" for t in TYPES for op in ("ref", "unref")}
# every object is made by its static rxkb_TYPE_create (noinline by the patch);
# rxkb_context_new calls rxkb_context_create and drops it when no path is usable
CONSTRUCTORS = {f"rxkb_{t}": f"rxkb_{t}_create" for t in TYPES}
TOOLS = ("xkbcli-list",)
TESTS = ("test-registry",)
NOWHERE = "/nonexistent-xkb2"
# (label, shell command run with `exec`; BUILD and SRC are the build and source trees).
# xkbcli-list first: the library's own sites run under the machine's whole rules XML
# (xkb-data's evdev.xml: about a thousand layouts and variants); then other rulesets,
# merged include paths, the error paths (a ruleset that does not exist, no usable
# include path at all, so rxkb_context_new fails), then the unit test
WORKLOADS = (
    ("xkbcli-list", "BUILD/xkbcli-list > /dev/null"),
    ("xkbcli-list --load-exotic", "BUILD/xkbcli-list --load-exotic > /dev/null"),
    ("xkbcli-list base, tree's data", "BUILD/xkbcli-list --skip-default-paths --ruleset base "
     "SRC/test/data > /dev/null"),
    ("xkbcli-list merged extra path", "env XKB_CONFIG_EXTRA_PATH=SRC/test/data "
     "BUILD/xkbcli-list > /dev/null"),
    ("xkbcli-list no ruleset", "BUILD/xkbcli-list --ruleset nosuchrules"),
    ("xkbcli-list no include path", f"env HOME={NOWHERE} XDG_CONFIG_HOME={NOWHERE} "
     f"XKB_CONFIG_EXTRA_PATH={NOWHERE} XKB_CONFIG_ROOT={NOWHERE} BUILD/xkbcli-list"),
    ("test registry", "BUILD/test-registry"),
)


def codebase(out: Path) -> Codebase:
    return xkb.tree_codebase(out, "xkbregistry", Api(GETS, PUTS, {}, TYPE),
                             "libxkbregistry.so.0",
                             ["src/registry.c", "tools/registry-list.c", "test/registry.c"],
                             [*TOOLS, *TESTS], WORKLOADS)


def prepare(cb: Codebase) -> None:
    steps = xkb.patched_build(cb, PACKAGES, "registry-noinline.patch", MESON)
    steps["packages"] = {p: debian.version(p) for p in ("xkb-data", "libxml2-dev")}
    spec = (HERE / "xkbcommon" / "xkbregistry.yaml").read_text()
    cb.spec.write_text(spec.replace("library: libxkbregistry.so.0",
                                    f"library: {cb.binaries[0]}"))
    cb.prepared = steps


def probes(cb: Codebase) -> tuple[list[tracefs.Probe], dict[str, truth.Rule]]:
    """The constructors' returns, and the entries of every ref and unref."""
    return api_probes(cb.binaries[0].resolve(), CONSTRUCTORS, GETS, PUTS, "rxkb")

"""The third codebase: fontconfig, -O2 with its static helpers inlined (issue 41).

Debian's fontconfig source (`apt-get source fontconfig`), built with meson
debugoptimized (-O2 -g) and frame pointers, its tools and its unit tests, never
installed: the tools find the built libfontconfig through their build RPATH and
read the machine's /etc/fonts and font caches.  The objects are FcPattern,
FcCharSet and, added for a later held-out batch, FcStrSet
(fontconfig/fontconfig.yaml says why FcConfig is left out).  fcalias makes every
internal call go to a hidden alias (`IA__FcPatternDestroy`) at the public
function's address, so a call instruction may name either.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import debian
import tracefs
import truth
from codebase import Codebase, Workload, debian_meson
from sites import Api

HERE = Path(__file__).resolve().parent
PACKAGES = ["meson", "ninja-build", "gperf", "pkg-config", "libfreetype-dev", "libexpat1-dev",
            "uuid-dev", "dpkg-dev", "fonts-dejavu-core", "fonts-liberation"]
MESON = ["--buildtype=debugoptimized", "-Dc_args=-fno-omit-frame-pointer", "--prefix=/usr",
         "--sysconfdir=/etc", "--localstatedir=/var", "-Ddoc=disabled", "-Dnls=disabled",
         "-Dtests=enabled", "-Dtools=enabled", "-Dcache-build=disabled"]
GETS = frozenset({"FcPatternReference", "FcCharSetCopy", "FcRuleSetReference"})
PUTS = frozenset({"FcPatternDestroy", "FcCharSetDestroy", "FcStrSetDestroy", "FcStrListDone",
                  "FcRuleSetDestroy"})
TYPE = {"FcPatternReference": "FcPattern", "FcPatternDestroy": "FcPattern",
        "FcCharSetCopy": "FcCharSet", "FcCharSetDestroy": "FcCharSet",
        "FcStrSetDestroy": "FcStrSet", "FcStrListDone": "FcStrSet",
        "FcRuleSetReference": "FcRuleSet", "FcRuleSetDestroy": "FcRuleSet"}
# FcRuleSet (batch 5, issue 41): a configuration file's rules, made per file parsed,
# referenced by each substitution list and the configuration's list that holds it
CONSTRUCTORS = {"FcPattern": ("FcPatternCreate", "FcPatternDuplicate"),
                "FcCharSet": ("FcCharSetCreate", "FcCharSetOperate", "FcNameParseCharSet"),
                "FcStrSet": ("FcStrSetCreate",), "FcRuleSet": ("FcRuleSetCreate",)}
VOID_GETS = frozenset({"FcPatternReference", "FcRuleSetReference"})  # get added: called twice
# FcStrSet (added for a third held-out batch, issue 41: sites the rules were never tuned
# on): the sets FcStrSetCreateEx makes are not seen made (gcc inlined it into
# FcStrSetCreate and FcStrBuildFilename, and refcntd refuses a spec naming a function
# with inlined copies), only FcStrSetCreate's.  Its only get is the static
# FcStrSetReference inlined into FcStrListCreate, which takes a reference on the set
# for the list it returns; FcStrListDone drops it through
# FcStrSetDestroy.  The truth and the spec probe FcStrListCreate as the get; its sites
# are not mutated (it returns the list, not the set), the puts' sites are (deleting
# FcStrListDone leaks the set's reference and the list's memory)
SET_GETS = frozenset({"FcStrListCreate"})
PROBED_PUTS = PUTS - {"FcStrListDone"}  # FcStrListDone's put is FcStrSetDestroy's
FONTS = "/usr/share/fonts/truetype"
# FcPatternFormat's filters (+ keeps, - drops, [] enumerates) and a charset printed
FORMAT = ("%{+family,style{%{=unparse}}}\n%{-file,charset,lang{%{=unparse}}}\n"
          "%{[]family,familylang{%{family} (%{familylang})\n}}%{charset}\n")
TOOLS = ("fc-match", "fc-list", "fc-pattern", "fc-query", "fc-scan", "fc-cat", "fc-conflist",
         "fc-validate", "fc-cache")
TESTS = ("name_parse", "family_matching", "bz89617", "bz131804", "bz1744377", "bz96676",
         "bz106618", "issue180", "bz106632", "crbug1004254", "issue107")
# (label, path under the build, arguments): the tools on the machine's fonts and the
# unit tests that end by themselves (bz106632, 6 s, rebuilds caches of a font
# directory of its own); one process each, no randomness
WORKLOADS = (
    ("fc-match -s", "fc-match/fc-match", ("-s", "DejaVu Sans:bold")),
    ("fc-match charset", "fc-match/fc-match", ("-s", ":charset=41-5a 3b1-3c9")),
    ("fc-match format", "fc-match/fc-match", ("-f", FORMAT, "DejaVu Sans")),
    ("fc-list", "fc-list/fc-list", ()),
    ("fc-pattern", "fc-pattern/fc-pattern", ("-c", "-d", "Liberation Serif:italic")),
    ("fc-query", "fc-query/fc-query", (f"{FONTS}/liberation/LiberationSans-Regular.ttf",)),
    ("fc-scan", "fc-scan/fc-scan", (FONTS,)),
    ("fc-cat", "fc-cat/fc-cat", ()),
    *((f"test {t}", f"test/test_{t}", ()) for t in TESTS[:-2]),
)
# added after the single-run rules were changed on the mutants of the workloads above
# (issue 41): the sites only these run are held out.  A configuration of charset tests,
# edits and rejects (fcxml.c's charset expressions and patterns, FcCharSetSubtract at
# each match), a bitmap font, a charset printed, and the two slower tests
CONF = """<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "urn:fontconfig:fonts.dtd">
<fontconfig>
  <include ignore_missing="no">/etc/fonts/fonts.conf</include>
  <match target="pattern">
    <test name="charset" compare="contains">
      <charset><range><int>0x41</int><int>0x5a</int></range></charset></test>
    <edit name="family" mode="append"><string>DejaVu Sans</string></edit>
  </match>
  <match target="font">
    <edit name="charset" mode="assign">
      <minus><name>charset</name><charset><int>0x7f</int></charset></minus></edit>
  </match>
  <selectfont><rejectfont>
    <pattern><patelt name="charset"><charset><int>0x10fffd</int></charset></patelt></pattern>
    <pattern><patelt name="family"><string>No Such Family</string></patelt></pattern>
  </rejectfont></selectfont>
</fontconfig>
"""
HELD_OUT = (
    ("conf fc-match", "fc-match/fc-match", ("-s", ":charset=41-5a")),
    ("conf fc-list", "fc-list/fc-list", (":", "family", "charset")),
    ("fc-query pcf", "fc-query/fc-query", ("SRC/test/4x6.pcf",)),
    ("fc-pattern charset", "fc-pattern/fc-pattern", ("-f", "%{charset}\n",
                                                     ":charset=20-7e 3b1-3c9")),
    *((f"test {t}", f"test/test_{t}", ()) for t in TESTS[-2:]),
)
# batch 4 (issue 41), added after the rules of db2cf22 were committed and before any
# of its mutants ran: tools no batch ran (fc-conflist, fc-validate, fc-cache into a
# cache directory of its own), error paths (a configuration with mistakes fontconfig
# warns about and goes on: a missing include, bad values, an unknown element, an
# inverted charset range; a file that is no font, a truncated font, a pattern that
# does not parse) and calls no workload made (fc-match -a, fc-list -v, aliases,
# langsets, a scan rule).  Their argv's WORK is the codebase's work directory.
BAD_CONF = """<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "urn:fontconfig:fonts.dtd">
<fontconfig>
  <include ignore_missing="no">/etc/fonts/fonts.conf</include>
  <include ignore_missing="no">/nonexistent/refcntd.conf</include>
  <dir>/nonexistent/fonts</dir>
  <bogus><string>unknown element</string></bogus>
  <alias binding="same"><family>Sansy</family>
    <prefer><family>DejaVu Sans</family></prefer>
    <accept><family>Liberation Sans</family></accept>
    <default><family>sans-serif</family></default></alias>
  <match target="pattern">
    <test name="family"><string>Sansy</string></test>
    <edit name="weight" mode="assign"><int>notanumber</int></edit>
    <edit name="lang" mode="prepend"><string>ja</string></edit></match>
  <match target="pattern">
    <test name="lang" compare="contains"><langset><string>ja</string><string>zh-cn</string>
      </langset></test>
    <edit name="family" mode="append_last"><string>Liberation Serif</string></edit></match>
  <match target="pattern">
    <test name="charset"><charset><range><int>0x5a</int><int>0x41</int></range></charset>
    </test>
    <edit name="family" mode="append"><string>Liberation Mono</string></edit></match>
  <match target="font">
    <test name="pixelsize" compare="more"><double>1</double></test>
    <edit name="pixelsize" mode="assign"><times><name>pixelsize</name><double>1.5</double>
      </times></edit></match>
  <match target="scan">
    <test name="family"><string>DejaVu Sans</string></test>
    <edit name="charset" mode="assign"><plus><name>charset</name><charset><int>0x2603</int>
      </charset></plus></edit></match>
  <selectfont><acceptfont><glob>/usr/share/fonts/*</glob>
    <pattern><patelt name="family"><string>DejaVu Sans</string></patelt></pattern>
  </acceptfont></selectfont>
</fontconfig>
"""
CACHE_CONF = """<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "urn:fontconfig:fonts.dtd">
<fontconfig>
  <dir>WORK/fontdir</dir>
  <cachedir>WORK/cache</cachedir>
</fontconfig>
"""
BATCH4 = (
    ("bad conf fc-match", "bad.conf", "fc-match/fc-match", ("-s", "Sansy:pixelsize=12")),
    ("bad conf fc-list", "bad.conf", "fc-list/fc-list", (":lang=ja", "family", "lang")),
    ("bad conf fc-match charset", "bad.conf", "fc-match/fc-match",
     ("-a", ":charset=41-5a")),
    ("fc-conflist", "bad.conf", "fc-conflist/fc-conflist", ()),
    ("fc-validate", "fonts.conf", "fc-validate/fc-validate",
     ("-l", "ja", f"{FONTS}/dejavu/DejaVuSans.ttf")),
    ("fc-cache", "cache.conf", "fc-cache/fc-cache", ("-f", "-v")),
    ("fc-scan junk", "fonts.conf", "fc-scan/fc-scan", ("WORK/fontdir",)),
    ("fc-query junk", "fonts.conf", "fc-query/fc-query", ("WORK/fontdir/notafont.ttf",)),
    ("fc-pattern bad", "fonts.conf", "fc-pattern/fc-pattern", ("-c", "-d", "DejaVu:size=x")),
    ("fc-match -a", "fonts.conf", "fc-match/fc-match", ("-a", "Liberation Mono:bold")),
    ("fc-list -v", "fonts.conf", "fc-list/fc-list", ("-v", "DejaVu Sans Mono:bold")),
)

# batch 6 (issue 41): defined after batch 5 was read and the rules tuned on it, with
# the rules frozen at main 949db32 (refcntd/analysis tree f2974e1): workloads no batch
# ran.  Languages no table knows (a langset's extra string set: its lists, copies,
# unions and differences), an object set and a bad format for fc-pattern, fc-cat and
# fc-cache on directories named, a configuration with langset tests and arithmetic,
# xdg prefixes, a remapped directory and a pattern element with no name, and two
# FC_DEBUG printouts (the match filter's pattern pairs, a face's missing characters
# per language).  (label, configuration, environment, path, arguments)
LANG_CONF = """<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "urn:fontconfig:fonts.dtd">
<fontconfig>
  <include ignore_missing="no">/etc/fonts/fonts.conf</include>
  <dir prefix="xdg">fonts</dir>
  <remap-dir as-path="/usr/share/fonts" prefix="xdg">fonts</remap-dir>
  <match target="pattern">
    <test name="lang" compare="contains"><langset><string>qaa</string></langset></test>
    <edit name="lang" mode="assign"><plus><name>lang</name><langset><string>tlh</string>
      <string>de</string></langset></plus></edit></match>
  <match target="pattern">
    <edit name="lang" mode="assign"><minus><name>lang</name><langset><string>en</string>
      </langset></minus></edit></match>
  <selectfont><acceptfont>
    <pattern><patelt><string>no name</string></patelt></pattern>
  </acceptfont></selectfont>
</fontconfig>
"""
CACHE6_CONF = CACHE_CONF.replace("WORK/cache", "WORK/cache6")
LANGS = ":lang=qaa|tlh|en"
BATCH6 = (
    ("fc-pattern langs", "fonts.conf", (), "fc-pattern/fc-pattern", ("-c", "-d", LANGS)),
    ("fc-pattern langs format", "fonts.conf", (), "fc-pattern/fc-pattern",
     ("-f", "%{[]lang{%{lang} }}\n", LANGS)),
    ("fc-match langs", "fonts.conf", (), "fc-match/fc-match", ("-s", ":lang=qaa|tlh")),
    ("fc-list langs", "fonts.conf", (), "fc-list/fc-list", (":lang=qaa", "family")),
    ("fc-pattern object set", "fonts.conf", (), "fc-pattern/fc-pattern",
     ("DejaVu Sans:bold", "family", "style")),
    ("fc-pattern bad format", "fonts.conf", (), "fc-pattern/fc-pattern",
     ("-f", "%{-}", "DejaVu Sans")),
    ("fc-cat -v -r", "fonts.conf", (), "fc-cat/fc-cat", ("-v", "-r")),
    ("fc-cache -r dir", "cache6.conf", (), "fc-cache/fc-cache", ("-r", "-v", "WORK/fontdir")),
    ("lang conf fc-match", "lang.conf", (), "fc-match/fc-match", ("-s", "DejaVu Sans:lang=qaa")),
    ("FC_DEBUG match filter", "fonts.conf", ("FC_DEBUG=4096", "FC_DBG_MATCH_FILTER=family,style"),
     "fc-match/fc-match", ("DejaVu Sans:bold",)),
    ("FC_DEBUG langset fc-query", "fonts.conf", ("FC_DEBUG=2048",), "fc-query/fc-query",
     (f"{FONTS}/dejavu/DejaVuSans.ttf",)),
)


def _only(workloads: list[Workload]) -> list[Workload]:
    """MUTANTS_FC_ONLY=LABEL,LABEL: run these workloads only (batch 5's FcRuleSet sites
    run in every workload's configuration parse: fewer baselines, same sites)."""
    only = os.environ.get("MUTANTS_FC_ONLY")
    return [w for w in workloads if w.label in only.split(",")] if only else workloads


def codebase(out: Path) -> Codebase:
    work = out / "fontconfig"
    build = work / "build"
    api = Api(GETS, PUTS, {}, TYPE, VOID_GETS)
    targets = {n: ("get" if n in GETS else "put") for n in GETS | PUTS}
    targets |= {f"IA__{n}": role for n, role in targets.items()}
    return Codebase(
        "fontconfig", work, work / "src", build, api, targets,
        ["src/*.c", "fc-*/*.c", "test/*.c"],
        [build / "src" / "libfontconfig.so.1", *(build / t / t for t in TOOLS),
         *(build / "test" / f"test_{t}" for t in TESTS)],
        _only([*(Workload(label, (str(build / path), *args)) for label, path, args in WORKLOADS),
         *(Workload(label, ("/usr/bin/env", f"FONTCONFIG_FILE={work / 'fonts.conf'}",
                            str(build / path), *(a.replace("SRC", str(work / "src"))
                                                 for a in args)))
           for label, path, args in HELD_OUT),
         *(Workload(label, ("/usr/bin/env", f"FONTCONFIG_FILE={work / conf}",
                            str(build / path), *(a.replace("WORK", str(work)) for a in args)))
           for label, conf, path, args in BATCH4),
         *(Workload(label, ("/usr/bin/env", f"FONTCONFIG_FILE={work / conf}", *env,
                            str(build / path), *(a.replace("WORK", str(work)) for a in args)))
           for label, conf, env, path, args in BATCH6)]),
        work / "fontconfig-built.yaml", env={"FONTCONFIG_FILE": "/etc/fonts/fonts.conf"},
        build_cmd=["ninja", "-C", str(build)])


def prepare(cb: Codebase) -> None:
    debian.install(PACKAGES)
    steps = debian_meson(cb, "fontconfig", MESON)
    (cb.work / "fonts.conf").write_text(CONF)
    (cb.work / "bad.conf").write_text(BAD_CONF)
    (cb.work / "cache.conf").write_text(CACHE_CONF.replace("WORK", str(cb.work)))
    (cb.work / "cache6.conf").write_text(CACHE6_CONF.replace("WORK", str(cb.work)))
    (cb.work / "lang.conf").write_text(LANG_CONF)
    _font_dir(cb.work / "fontdir")
    spec = (HERE / "fontconfig" / "fontconfig.yaml").read_text()
    cb.spec.write_text(spec.replace("library: libfontconfig.so.1",
                                    f"library: {cb.binaries[0]}"))
    cb.prepared = steps


def _font_dir(d: Path) -> None:
    """Batch 4's directory: two fonts, a truncated one, a file that is no font and a
    subdirectory (fc-cache's and fc-scan's error paths and their directory sets)."""
    (d / "sub").mkdir(parents=True, exist_ok=True)
    shutil.copy(f"{FONTS}/dejavu/DejaVuSans.ttf", d / "DejaVuSans.ttf")
    shutil.copy(f"{FONTS}/liberation/LiberationMono-Bold.ttf", d / "sub" / "Mono.ttf")
    font = Path(f"{FONTS}/dejavu/DejaVuSerif.ttf").read_bytes()
    (d / "truncated.ttf").write_bytes(font[:4096])
    (d / "notafont.ttf").write_text("not a font\n")


def probes(cb: Codebase) -> tuple[list[tracefs.Probe], dict[str, truth.Rule]]:
    """Constructors' returns, and the entries of Reference/Copy and Destroy.  Objects
    read from a cache (count -1) are never seen created: the truth keeps them apart."""
    from coverage import symbol_offsets
    lib = cb.binaries[0].resolve()
    news = [(t, f) for t, fs in CONSTRUCTORS.items() for f in fs]
    at = symbol_offsets(lib, [f for _, f in news] + sorted(GETS | SET_GETS | PROBED_PUTS))
    found: list[tracefs.Probe] = []
    rules: dict[str, truth.Rule] = {}
    for i, (type_, f) in enumerate(news):
        found.append(tracefs.Probe(f"fc_new{i}", str(lib), at[f], "obj=$retval:x64", ret=True))
        rules[f"fc_new{i}"] = truth.Rule(truth.INIT_RETURN, type_)
    for i, f in enumerate(sorted(GETS | SET_GETS | PROBED_PUTS)):
        found.append(tracefs.Probe(f"fc_op{i}", str(lib), at[f], "obj=%di:x64"))
        rules[f"fc_op{i}"] = truth.Rule(truth.PUT_FREES if f in PUTS else truth.GET)
    return found, rules

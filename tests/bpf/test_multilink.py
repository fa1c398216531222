"""Every probe goes through BPF_TRACE_UPROBE_MULTI links on this kernel (6.18): function
probes, call-site probes and USDT probes with semaphores, exact counts, and no per-site
perf event left to close at detach.  A refused multi link would be a report note.

Runs use --no-leak-kinds: the subject here is multi-uprobe links; what the fixtures leak
is often still reachable at exit (kept in a global, or a pointer left on a stack), which
the default lists without failing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from conftest import EXAMPLES, REFCNTD, ROOT, cc, leak_summary, refcntd
from test_callsites import GETS_PUTS, TRUTH, build_fixture

from refcntd.kernel.perf_uprobe import held_fds

RUN = ["run", "--no-leak-kinds"]  # the module docstring says why

SITES = 600  # call sites of the -O2 get stub in the many-site target
MULTI_NOTE = re.compile(r"(\d+) probe\(s\) attached through (\d+) multi-uprobe link\(s\)")


def multi_attached(report: dict) -> tuple[int, int]:
    """(probes, links) from the report's note; no probe may have fallen back."""
    notes = report["tracing"]["notes"]
    assert not [n for n in notes if "fell back" in n], notes
    (found,) = [m for m in map(MULTI_NOTE.search, notes) if m]
    return int(found.group(1)), int(found.group(2))


def test_function_and_callsite_probes_share_multi_links(bpf, build, tmp_path):
    exe, plugin = build_fixture(build, tmp_path)
    result = refcntd([*RUN, "--probe-mode", "auto", "--", str(exe), str(plugin)],
                     tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    assert leak_summary(process) == TRUTH
    assert sorted((i["gets"], i["puts"]) for g in process["groups"]
                  for i in g["instances"]) == GETS_PUTS
    statuses = result.report["tracing"]["probes"]
    modes = {p["role"]: p["mode"] for p in statuses}
    assert modes["init"] == modes["get"] == "callsites" and modes["delete"] == "entry"
    probes, links = multi_attached(result.report)
    planned = sum(p["sites"] for p in statuses)
    files = {p["module"] for p in statuses}  # csmain, libcsuser.so, and the plugin (later)
    assert len(files) == 3 and (probes, links) == (planned, 3), statuses


def test_usdt_with_semaphores_through_a_multi_link(bpf, build, tmp_path):
    exe, module = build.usdt_program("-O2", True)
    spec = tmp_path / "spec.yaml"
    text = (ROOT / "configs/specs/example-usdt.yaml").read_text()
    spec.write_text(text.replace("roles:\n", f"library: {module}\nroles:\n"))
    result = refcntd([*RUN, "--spec", str(spec), "--", str(exe)], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    assert result.stdout.strip() == "guarded 8"  # every semaphore was raised by the link
    (process,) = result.report["processes"]
    assert leak_summary(process) == {"widget": [1, 2]}
    probes, links = multi_attached(result.report)
    assert probes == 4 and links == 1


def many_sites(build_dir: Path) -> Path:
    """SITES get call sites, as many puts in a loop, then it waits on fifo `argv[1]`."""
    src = build_dir / "many.c"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text('#include <stdio.h>\n#include <stdlib.h>\n#include "refcnt.h"\n'
                   "struct obj { atomic_t refcnt; };\n"
                   "int main(int argc, char **argv)\n{\n"
                   "\tstruct obj *o = calloc(1, sizeof(*o));\n"
                   '\trefcnt__init_as(o, refcnt, 1, "obj");\n'
                   + "\trefcnt__get(o, refcnt);\n" * SITES +
                   f"\tfor (int i = 0; i < {SITES}; i++)\n\t\trefcnt__put(o, refcnt);\n"
                   '\tputs("ready");\n\tfflush(stdout);\n'
                   '\tfclose(fopen(argv[1], "r"));\n\treturn 0;\n}\n')
    stubs = build_dir / "refcnt-O2.o"
    cc(stubs, [EXAMPLES / "refcnt.c"], ["-O2", "-c"])
    return cc(build_dir / "many", [src, stubs], ["-O2"])


def test_many_call_sites_one_link_no_perf_events(bpf, tmp_path):
    exe = many_sites(tmp_path / "build")
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    proc = subprocess.Popen([*REFCNTD, *RUN, "--json", str(tmp_path / "r.json"),
                             "--probe-mode", "callsites", "--", str(exe), str(fifo)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        kinds = held_fds(proc.pid)
    finally:
        with open(fifo, "w"):
            pass
        proc.wait(timeout=120)
    assert proc.returncode == 23, proc.stderr.read()
    report = json.loads((tmp_path / "r.json").read_text())
    (process,) = report["processes"]
    (group,) = process["groups"]
    (instance,) = group["instances"]
    assert (instance["count"], instance["gets"], instance["puts"]) == (1, SITES, SITES)
    probes, links = multi_attached(report)
    assert probes > SITES
    # one link per (file, direction) plus ld.so's, nothing per site: detach closes a
    # few fds (the perf events left are the tracepoints', each with its own link)
    assert kinds["bpf_link"] == links + 1 + kinds["[perf_event]"], kinds
    assert kinds["[perf_event]"] < 20 < SITES, kinds

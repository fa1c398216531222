"""The one-file HTML report: every section, nothing fetched, everything escaped.
(tests/bpf/test_profiles.py opens real ones in headless Chromium.)"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import replace
from pathlib import Path

from test_cli_outputs import EVIL, RAW_CONTROL, evil_result
from test_pprof import result

from refcntd.analysis.judging import Verdict
from refcntd.analysis.model import AnomalyFinding, HistoryStep
from refcntd.analysis.pathops import Culprit
from refcntd.outputs.html import render_html
from refcntd.symbolize.symbolizer import Frame

SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)
STYLE = re.compile(r"<style>(.*?)</style>", re.S)
DATA = re.compile(r'<script id="flame-data" type="application/json">(.*?)</script>', re.S)


def full_result(tmp_path: Path):
    r = result(tmp_path)
    p = r.processes[0]
    g = p.groups[0]
    get = Frame("/bin/x", 0x1700, "cache_lookup", 3, "/src/cache.c", 77)
    culprit = Culprit("missing put", get, (get,), 1, 9, 4, why="first function that keeps it",
                      expected=(Frame("/bin/x", 0x1800, "cache_done", 1),))
    g.culprits, g.verdict = [culprit], Verdict("culprit", "one unmatched get", [culprit])
    p.groups[1].objects[0] = type(p.groups[1].objects[0])(
        0x30, 2, 1, 0, 4_000_000, (HistoryStep("init", 1, (get,), 0),
                                   HistoryStep("get", 2, (get,), 1_000_000)), 2)
    p.anomalies.append(AnomalyFinding("double-put", "map", 0x50, 0, (get,), (g.frames[1],), 3))
    return r


def tree_names(node, names):
    yield names[node[0]]
    for kid in node[3]:
        yield from tree_names(kid, names)


def test_every_section(tmp_path) -> None:
    page = render_html([full_result(tmp_path)])
    for needle in ("<h2>Types</h2>", "Likely culprit: missing put in cache_lookup",
                   "why: first function that keeps it", "expected put: cache_done",
                   "history of 0x30: 2 of 2 operation(s)", "ANOMALY double-put",
                   "allocated at", "Leaked 2 object(s) of type <code>map</code>",
                   "4 objects leaked", "verdict: culprit"):
        assert needle in page, needle
    data = json.loads(DATA.search(page).group(1))
    root = data["root"]
    assert root[1:3] == [4, 14]  # objects, references: the whole run
    names = list(tree_names(root, data["names"]))
    assert {"[map]", "[dso]", "map__new", "prog (42)"} <= set(names)
    assert "__refcnt__init" not in names  # as in the pprof profile
    row = re.search(r"<tr><td><code>map</code></td>(.*?)</tr>", page).group(1)
    assert re.findall(r">(\d+)<", row)[:2] == ["2", "11"]


def test_fetches_nothing_and_csp_pins_the_inline_code(tmp_path) -> None:
    page = render_html([full_result(tmp_path)], live=True)
    assert not re.search(r"\b(src|href)\s*=|url\(|@import|https?://", page)
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    assert "default-src 'none'" in csp
    for pattern, directive in ((SCRIPT, "script-src"), (STYLE, "style-src")):
        (code,) = pattern.findall(page)
        digest = base64.b64encode(hashlib.sha256(code.encode()).digest()).decode()
        assert f"{directive} 'sha256-{digest}'" in csp
    assert "target <code>prog</code>" in page and "4 live objects" in page


def test_hostile_names_cannot_break_out(tmp_path) -> None:
    r = evil_result(tmp_path)
    r.processes[0].groups[0].type_name = EVIL + "</script><script>alert(1)</script>\udcff"
    frames = list(r.processes[0].groups[0].frames)
    frames[0] = Frame("/bin/x", 0x1000, "<img src=x onerror=alert(1)>&amp;", 4)
    r.processes[0].groups[0].frames = tuple(frames)
    page = render_html([r])
    assert not RAW_CONTROL.search(page.replace("\n", ""))
    assert page.count("<script") == 2 and page.count("</script>") == 2
    assert "<img" not in page and "alert(1)</script>" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;&amp;amp;" in page
    data = json.loads(DATA.search(page).group(1))
    assert any("\\x1b[31m" in n and "</script>" in n and "\\udcff" in n
               for n in data["names"])
    page.encode("utf-8")  # no lone surrogate left


def test_mean_age_of_objects_under_a_millisecond(tmp_path) -> None:
    """0.08-0.15 ms objects: the Types table said "mean age 0.0 ms" (whole milliseconds
    summed before dividing; issue 41)."""
    r = result(tmp_path)
    g = r.processes[0].groups[0]  # two map objects
    g.objects = [replace(o, age_ns=age) for o, age in zip(g.objects, (80_000, 150_000),
                                                           strict=True)]
    page = render_html([r])
    row = re.search(r"<tr><td><code>map</code></td>(.*?)</tr>", page).group(1)
    assert "0.1 ms" in row and "0.0 ms" not in row  # mean 0.115 ms

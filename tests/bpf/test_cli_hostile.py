"""Hostile names and stable order through real tracing (issue 18 items 5 and 6).

Runs use --no-leak-kinds: the subject here is hostile text in reports; what the fixtures
leak is often still reachable at exit (kept in a global, or a pointer left on a stack),
which the default lists without failing.
"""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree as ET

from conftest import FIXTURES, ROOT, functions, refcntd

RUN = ["run", "--no-leak-kinds"]  # the module docstring says why


def run_twice(exe: Path, tmp_path: Path) -> list[tuple[str, dict, list[str]]]:
    out = []
    for n in (1, 2):
        junit = tmp_path / f"r{n}.xml"
        result = refcntd([*RUN, "--junit", str(junit), "--source-root", str(ROOT), "--",
                          str(exe)], tmp_path / f"r{n}.json")
        assert result.returncode == 23, result.stderr
        xml = ET.parse(junit)  # control characters would make this raise
        out.append((result.stderr, result.report,
                    [c.get("name", "") for c in xml.iter("testcase")]))
    return out


def test_control_characters_and_stable_order(bpf, build, tmp_path):
    exe = build.program("hostile", [FIXTURES / "hostile.c"], "O2")
    (err1, rep1, cases1), (err2, rep2, cases2) = run_twice(exe, tmp_path)
    assert "\x1b" not in err1 and "\x01" not in err1
    assert "of type 'ev\\x1b[1mil\\x01'" in err1
    (proc,) = rep1["processes"]
    assert proc["groups"][3]["type"] == "ev\x1b[1mil\x01"  # JSON keeps the real bytes
    order = [(g["type"], len(g["instances"]), functions(g)[1]) for g in proc["groups"]]
    assert order == [("plain", 2, "site_a"), ("plain", 2, "site_b"), ("plain", 2, "site_c"),
                     ("ev\x1b[1mil\x01", 1, "make_evil")]
    again = [(g["type"], len(g["instances"]), functions(g)[1])
             for g in rep2["processes"][0]["groups"]]
    assert again == order
    assert cases1 == cases2 and len(cases1) == 4
    assert cases1[0].startswith("leak plain at __refcnt__init < site_a < main")
    assert cases1[3].startswith("leak ev\\x1b[1mil\\x01 at __refcnt__init < make_evil")

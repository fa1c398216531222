"""The culprit's line, not only its function (issue 31, item 4), on real BPF.

culpritlines.c built -O2 -g -fomit-frame-pointer: an extra get made through an
inline get wrapper at a known line, a missing put whose reference came in
at one known line and which released objects put at another, and a missing put
no released object shows, named by the culprit's last call that touched the
object (the put is missing after it).  The lines are
read from the fixture's `LINE:` markers; the report must name exactly them,
in --json, in the text and in SARIF (saved and rendered again).  Without
DWARF the function alone is named, with no line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
from conftest import FIXTURES, ROOT, Build, Result, assert_probe_mode, marked_line, refcntd
from test_ci import SARIF_SCHEMA
from test_run import lib_spec

SOURCE = FIXTURES / "culpritlines.c"
URI = SOURCE.relative_to(ROOT).as_posix()


def marked(name: str) -> int:
    return marked_line(SOURCE, name)


def program(build: Build) -> Path:
    return build.program("culpritlines", [SOURCE], "O2",
                         flags=["-fomit-frame-pointer", "-Wall", "-Werror"])


def run(exe: Path, tmp_path: Path) -> tuple[Result, dict[str, Any], dict[str, dict[str, Any]]]:
    """refcntd run --history with JSON and SARIF: (result, sarif, top culprit by type)."""
    sarif = tmp_path / "out.sarif"
    result = refcntd(["run", "--history", "--sarif", str(sarif), "--source-root", str(ROOT),
                      "--", str(exe)], tmp_path / "run.json")
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    tops = {g["type"]: g["culprits"][0] for g in process["groups"]}
    assert sorted(tops) == ["cfg", "sess", "tok"]
    return result, json.loads(sarif.read_text()), tops


def sarif_result(sarif: dict[str, Any], type_name: str) -> dict[str, Any]:
    (found,) = [r for r in sarif["runs"][0]["results"]
                if f"leaked {type_name} object" in r["message"]["text"]]
    return found


def located(result: dict[str, Any], key: str = "locations") -> tuple[str, int]:
    (loc,) = result[key]
    where = loc["physicalLocation"]
    return where["artifactLocation"]["uri"], where["region"]["startLine"]


def test_lines_of_extra_get_and_missing_put(bpf, build, tmp_path, probe_mode):
    result, sarif, tops = run(program(build), tmp_path)
    assert_probe_mode(result.report, probe_mode)
    extra, in_at, put_at = marked("extra-get"), marked("sess-in"), marked("sess-put")

    tok = tops["tok"]  # the second tok_get() call, past the inline wrapper's own line
    assert (tok["kind"], tok["function"]) == ("extra get", "tok_work_bad")
    assert (Path(tok["file"]), tok["line"]) == (SOURCE, extra)
    assert "put_line" not in tok
    sess = tops["sess"]
    assert (sess["kind"], sess["function"]) == ("missing put", "scenario_sess")
    assert (Path(sess["file"]), sess["line"]) == (SOURCE, in_at)
    assert (Path(sess["put_file"]), sess["put_line"]) == (SOURCE, put_at)
    skip = marked("sess-skip")  # the branch that skips the put (issue 41)
    assert (Path(sess["exit_file"]), sess["exit_line"]) == (SOURCE, skip)
    cfg, cfg_in, cfg_last = tops["cfg"], marked("cfg-in"), marked("cfg-last")
    assert (cfg["kind"], cfg["function"]) == ("missing put", "scenario_cfg")
    assert (Path(cfg["file"]), cfg["line"]) == (SOURCE, cfg_in)
    assert "put_line" not in cfg
    assert (Path(cfg["last_use_file"]), cfg["last_use_line"], cfg["last_use_call"]) == \
        (SOURCE, cfg_last, "cfg_apply")

    text = result.stderr
    assert f"Likely culprit: extra get in tok_work_bad (culpritlines.c:{extra}):" in text
    assert f"Likely culprit: missing put in scenario_sess (culpritlines.c:{skip}):" in text
    assert f"scenario_sess skips its put at culpritlines.c:{skip} (released objects put it " \
        f"at culpritlines.c:{put_at})" in text
    assert f"last used at culpritlines.c:{cfg_last} (call to cfg_apply); its put is " \
        "missing after that" in text

    jsonschema.Draft4Validator(SARIF_SCHEMA).validate(sarif)
    tok_result, sess_result = sarif_result(sarif, "tok"), sarif_result(sarif, "sess")
    assert located(tok_result) == (URI, extra)
    assert "relatedLocations" not in tok_result
    assert located(sess_result) == (URI, skip)
    assert located(sess_result, "relatedLocations") == (URI, put_at)
    cfg_result = sarif_result(sarif, "cfg")
    assert located(cfg_result) == (URI, cfg_in)
    assert located(cfg_result, "relatedLocations") == (URI, cfg_last)
    assert cfg_result["relatedLocations"][0]["message"]["text"].startswith(
        "last use of the reference (call to cfg_apply)")
    (stack,) = sess_result["stacks"]  # the allocation stack stays where it was
    assert stack["message"]["text"] == "allocation stack"
    assert [f["location"]["logicalLocations"][0]["fullyQualifiedName"]
            for f in stack["frames"][:2]] == ["__refcnt__init", "sess_open"]
    rendered = refcntd(["report", str(tmp_path / "run.json"), "--format", "sarif",
                        "--source-root", str(ROOT)])
    assert json.loads(rendered.stdout) == sarif


def test_without_dwarf_the_function_alone(bpf, build, tmp_path):
    """strip --strip-debug: the symbols stay, the DWARF goes: no line is invented."""
    exe = tmp_path / "bin" / "culpritlines"
    exe.parent.mkdir()
    shutil.copy(program(build), exe)
    subprocess.run(["strip", "--strip-debug", str(exe)], check=True)
    result, sarif, tops = run(exe, tmp_path)
    assert [(c["kind"], c["function"]) for c in (tops["tok"], tops["sess"], tops["cfg"])] == \
        [("extra get", "tok_work_bad"), ("missing put", "scenario_sess"),
         ("missing put", "scenario_cfg")]
    assert not {"file", "line", "put_file", "put_line", "last_use_line", "exit_line"} & \
        {k for c in tops.values() for k in c}
    assert "Likely culprit: extra get in tok_work_bad: the reference" in result.stderr
    assert "released objects put it at" not in result.stderr
    assert "skips its put" not in result.stderr
    for r in sarif["runs"][0]["results"]:
        assert "locations" not in r and "relatedLocations" not in r


def test_stripped_program_no_symbols_no_crash(bpf, build, tmp_path):
    """A program stripped of everything (its stubs in a shared library): its functions
    have no names, so neither a function nor a line is named, and nothing fails."""
    exe = tmp_path / "bin" / "culpritlines"
    exe.parent.mkdir()
    lib = build.stub_lib("O2")
    subprocess.run(["gcc", "-g", "-O2", "-fomit-frame-pointer", f"-I{ROOT / 'examples'}",
                    "-o", str(exe), str(SOURCE), f"-L{lib.parent}", "-lrefcnt",
                    f"-Wl,-rpath,{lib.parent}"], check=True)
    subprocess.run(["strip", str(exe)], check=True)
    sarif_path = tmp_path / "out.sarif"
    result = refcntd(["run", "--history", "--spec", str(lib_spec(tmp_path, lib)), "--sarif",
                      str(sarif_path), "--source-root", str(ROOT), "--", str(exe)],
                     tmp_path / "run.json")
    assert result.returncode == 23, result.stderr
    assert "Traceback" not in result.stderr
    (process,) = result.report["processes"]
    assert sorted(g["type"] for g in process["groups"]) == ["cfg", "sess", "tok"]
    assert all(g["verdict"]["status"] == "unknown" and "without a symbol" in
               g["verdict"]["reason"] for g in process["groups"])
    culprits = [c for g in process["groups"] for c in g["culprits"]]
    assert not {"file", "line", "put_file", "put_line"} & {k for c in culprits for k in c}
    assert all(r.get("locations") is None for r in
               json.loads(sarif_path.read_text())["runs"][0]["results"])


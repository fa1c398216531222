"""A tail call through the PLT (issue 31 item 5): a static helper whose last
statement is a library get, `jmp buf_ref@plt`, is off the stack when buf_ref
runs; the frame above its caller is in libbuf.so.  Its frame is put back from the
caller's `call helper` and the leak is blamed on it, not on its caller.

Real BPF on tests/fixtures/tailplt.c built -O2 -fomit-frame-pointer against
libbuf.so, in the PLT layouts Debian's binaries have: lazy `.plt`, and IBT's
`.plt.sec` with -z now.  Each process leaks exactly one buffer (truth in the
fixture's comment); plain calls through the PLT are the controls: no frame is
added to them.

Runs use --no-leak-kinds: the subject here is blame through tail calls; what the
fixtures leak is often still reachable at exit (kept in a global, or a pointer left on a
stack), which the default lists without failing.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, Build, assert_probe_mode, refcntd

from refcntd.binary.elf import ElfImage

RUN = ["run", "--no-leak-kinds"]  # the module docstring says why

LAYOUTS = {"plt": [], "plt.sec": ["-fcf-protection=full", "-Wl,-z,ibtplt", "-Wl,-z,now"]}
SPEC = """version: 1
name: libbuf
library: {lib}
roles:
  init:
    - {{functions: [buf_new], object: return, type: {{name: buf}}}}
  get:
    - {{functions: [buf_ref], object: arg1}}
  put:
    - {{functions: [buf_unref], object: arg1}}
"""
START = ["main", "__libc_start_call_main", "__libc_start_main_impl", "_start"]


def build_tailplt(root: Path, layout: str) -> tuple[Path, Path]:
    """(libbuf.so, tailplt linked with it in `layout`), the tail jump checked."""
    lib, exe = root / "libbuf.so", root / "tailplt"
    if exe.exists():
        return lib, exe
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-O2", "-g", "-fPIC", "-shared", "-o", str(lib),
                    str(FIXTURES / "libbuf.c")], check=True)
    subprocess.run(["gcc", "-O2", "-g", "-fomit-frame-pointer", "-Wall", "-Werror",
                    *LAYOUTS[layout], f"-I{FIXTURES}", "-o", str(exe),
                    str(FIXTURES / "tailplt.c"), f"-L{root}", "-lbuf",
                    f"-Wl,-rpath,{root}"], check=True)
    assert_tail_jump(exe, layout)
    return lib, exe


def assert_tail_jump(exe: Path, layout: str) -> None:
    """The compiler made what the test is about, or the test says so and stops."""
    sections = {s.name for s in ElfImage(exe).sections}
    if layout == "plt.sec" and ".plt.sec" not in sections:
        pytest.fail(f"{exe}: no .plt.sec with {LAYOUTS[layout]}: the IBT layout is untested")
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(exe)], check=True,
                          capture_output=True, text=True).stdout
    helper = re.search(r"^[0-9a-f]+ <(audit_and_forget[^>]*)>:\n((?:.+\n)+)", dump, re.M)
    if helper is None or not re.search(r"\tjmp +[0-9a-f]+ <buf_ref@plt>", helper.group(2)):
        pytest.fail(f"gcc did not make audit_and_forget end in `jmp buf_ref@plt` in {exe}:\n"
                    + (helper.group(0) if helper else "(no such function)"))


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def layout(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_tail_call_through_the_plt_is_blamed_on_the_helper(
        bpf: None, build: Build, layout: str, probe_mode: str, tmp_path: Path) -> None:
    lib, exe = build_tailplt(build.root / f"tailplt-{layout}", layout)
    spec = tmp_path / "libbuf.yaml"
    spec.write_text(SPEC.format(lib=lib))
    script = "; ".join(f"{exe} {s}" for s in ("tail", "plain", "main"))
    result = refcntd([*RUN, "--history", "all", "--spec", str(spec), "--", "/bin/sh", "-c",
                      script], tmp_path / "r.json", timeout=300)
    assert result.returncode == 23, result.stderr
    assert "nothing lost" in result.stderr, result.stderr
    assert result.report is not None
    assert_probe_mode(result.report, probe_mode)
    runs = {p["command"][1]: p for p in result.report["processes"] if p["command"][0] == str(exe)}
    assert sorted(runs) == ["main", "plain", "tail"]

    helper = get_culprit(runs["tail"])
    assert helper["kind"] == "missing put"
    assert base(helper["function"]) == "audit_and_forget"
    assert [base(f["function"]) for f in helper["stack"]] == ["audit_and_forget"]
    assert op_path(runs["tail"], "get") == ["audit_and_forget", "scenario_tail", *START]

    plain = get_culprit(runs["plain"])  # control: `call buf_ref@plt`, then more code
    assert (plain["kind"], [f["function"] for f in plain["stack"]]) == \
        ("missing put", ["keep_one"])
    assert op_path(runs["plain"], "get") == ["keep_one", "scenario_plain", *START]
    # scenario_plain puts its own reference by `jmp buf_unref@plt`: its frame is back
    assert op_path(runs["plain"], "put") == ["scenario_plain", *START]

    own = get_culprit(runs["main"])  # control: main's own `call buf_ref@plt`
    assert (own["kind"], [f["function"] for f in own["stack"]]) == ("extra get", ["main"])
    assert op_path(runs["main"], "get") == START


def base(function: str) -> str:
    return function.split(".")[0]


def get_culprit(process: dict[str, Any]) -> dict[str, Any]:
    """The one culprit of the process's one leak group, of one leaked buffer."""
    (group,) = process["groups"]
    assert [i["count"] for i in group["instances"]] == [1]
    assert group["verdict"]["status"] == "culprit", group["verdict"]
    (culprit,) = group["culprits"]
    return dict(culprit)


def op_path(process: dict[str, Any], op: str) -> list[str]:
    """The functions of the leaked buffer's one `op`, clone suffixes dropped."""
    (inst,) = process["groups"][0]["instances"]
    (step,) = [s for s in inst["history"] if s["op"] == op]
    return [base(f["function"]) for f in step["stack"]]

"""A user's own library and program, built as users build them (-O2 -g, no frame
pointers, unstripped): issue 29's libbuf.so and bufprog, from `spec draft` to the
report, in the daily modes."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from conftest import FIXTURES, leak_summary, refcntd
from test_attach import Attached


def build_libbuf(root: Path) -> tuple[Path, Path]:
    """(libbuf.so, bufprog linked with it by RUNPATH), built once per directory."""
    lib, prog = root / "libbuf.so", root / "bufprog"
    if not prog.exists():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-O2", "-g", "-fPIC", "-shared", "-o", str(lib),
                        str(FIXTURES / "libbuf.c")], check=True)
        subprocess.run(["gcc", "-O2", "-g", f"-I{FIXTURES}", "-o", str(prog),
                        str(FIXTURES / "bufprog.c"), f"-L{root}", "-lbuf",
                        f"-Wl,-rpath,{root}"], check=True)
    return lib, prog


def confirmed_draft(lib: Path, out: Path, library: str) -> Path:
    """`spec draft --library LIB`, confirmed as the user is told to (the `draft: true`
    line deleted), its `library:` written as `library`."""
    result = refcntd(["spec", "draft", "--library", str(lib), "--output", str(out)])
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert f"library: {lib}\n" in text, text
    out.write_text(text.replace("draft: true\n", "").replace(f"library: {lib}\n",
                                                             f"library: {library}\n"))
    return out


def test_attach_on_the_library_with_its_confirmed_draft(bpf, tmp_path_factory, tmp_path):
    """`attach --binary ./libbuf.so --spec draft.yaml` whose library says `libbuf.so`:
    the --binary file itself; bufprog 8 leaks exactly 2 buffers (every 4th request)."""
    lib, prog = build_libbuf(tmp_path_factory.mktemp("libbuf"))
    spec = confirmed_draft(lib, tmp_path / "draft.yaml", "libbuf.so")
    with Attached(["--binary", str(lib), "--spec", str(spec)], tmp_path / "a.json") as att:
        run = subprocess.run([str(prog), "8", "300"], capture_output=True, text=True)
        time.sleep(0.5)
        code, out, report = att.stop()
    assert run.returncode == 0, run.stderr
    (process,) = [p for p in report["processes"] if p["command"][0] == str(prog)]
    assert leak_summary(process) == {"buf": [1, 1]}  # requests 3 and 7
    assert report["leaked_objects"] == 2
    assert code == 0, out  # attach: 0 once detached, leaks or not (README)

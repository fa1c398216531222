"""Stacks through Debian's libcrypto.so.3 (no frame pointers, perlasm and C),
checked frame by frame against gdb's backtrace of the same call.

Runs use --no-leak-kinds: the subject here is unwinding OpenSSL; what the fixtures leak
is often still reachable at exit (kept in a global, or a pointer left on a stack), which
the default lists without failing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import FIXTURES, cc, refcntd

RUN = ["run", "--no-leak-kinds"]  # the module docstring says why

OUTSIDE = "outside every executable mapping"
GDB_FRAMES = r"""
import gdb
maps = [line.split() for line in gdb.execute("info proc mappings", to_string=True)
        .splitlines()]
def bias(path):
    return min(int(m[0], 16) for m in maps if m and m[-1].startswith("/")
               and os.path.realpath(m[-1]) == path)
f = gdb.newest_frame()
out = []
while f is not None:
    path = os.path.realpath(gdb.solib_name(f.pc()) or gdb.current_progspace().filename)
    out.append([path, f.pc() - bias(path), f.name() or ""])
    f = f.older()
print("FRAMES " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def cert(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=t", "-keyout", str(out / "k.pem"), "-out",
                    str(out / "c.pem")], check=True, capture_output=True)
    return out / "c.pem"


def gdb_backtraces(exe: Path, args: list[str], function: str, tmp_path: Path
                   ) -> list[list[list]]:
    """(module, address in it, function) per frame, at each call of `function`."""
    script = tmp_path / "frames.py"
    script.write_text("import json, os\n" + GDB_FRAMES)
    cmds = ["set pagination off", "set breakpoint pending on", f"break {function}", "run"]
    cmds += [f"source {script}", "continue"] * 8
    proc = subprocess.run(["gdb", "-q", "-batch", *[a for c in cmds for a in ("-ex", c)],
                           "--args", str(exe), *args], capture_output=True, text=True,
                          timeout=300)
    return [json.loads(line[7:]) for line in proc.stdout.splitlines()
            if line.startswith("FRAMES ")]


def test_stack_under_a_uretprobe_matches_gdb(bpf, cert, tmp_path):
    """EVP_PKEY_new 16 frames under d2i_X509, whose return address the uretprobe
    replaced: the stack went on to main, exactly as gdb walks it (without refcntd),
    and on to _start; before, it stopped at ASN1_item_d2i_ex, "outside every
    executable mapping" (the trampoline's page)."""
    if shutil.which("gdb") is None:
        pytest.fail("gdb (Debian's gdb package) is the oracle of this test: run scripts/setup.sh")
    exe = cc(tmp_path / "pemleak", [FIXTURES / "pemleak.c"], ["-O2", "-lcrypto"])
    result = refcntd([*RUN, "--spec", "openssl", "--", str(exe), str(cert)],
                     tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    (group,) = [g for g in process["groups"] if g["type"] == "EVP_PKEY"]
    assert not group["stack_truncated"], group["unwind"]
    ours = [[f["module"], int(f["address"], 16)] for f in group["stack"]]
    names = [f.get("function", "") for f in group["stack"]]
    assert names[-4:] == ["main", "__libc_start_call_main", "__libc_start_main_impl",
                          "_start"], group["stack"]
    for name in ("OSSL_DECODER_from_bio", "ASN1_item_d2i_ex", "PEM_ASN1_read_bio"):
        assert name in names, group["stack"]
    truths = gdb_backtraces(exe, [str(cert)], "EVP_PKEY_new", tmp_path)
    # gdb: frame 0 is EVP_PKEY_new; refcntd's stack of a returning constructor starts
    # at its caller; gdb stops at main
    assert any(ours[:len(t) - 1] == [f[:2] for f in t[1:]] for t in truths), (ours, truths)
    assert not [n for n in result.report["tracing"]["notes"] if OUTSIDE in n]


def test_every_stack_of_openssl_x509_is_whole(bpf, cert, tmp_path):
    """Every stack `openssl x509` stored (REFCNTD_DUMP_STACKS: all of them, not only
    the leaks') reaches its end; it printed "1450 stacks cut at a return address
    outside every executable mapping" before."""
    dump = tmp_path / "stacks"
    env = {**os.environ, "REFCNTD_DUMP_STACKS": str(dump)}
    result = refcntd([*RUN, "--spec", "openssl", "--", "openssl", "x509", "-in", str(cert),
                      "-noout", "-subject"], tmp_path / "r.json", env=env)
    assert "subject=" in result.stdout, result.stderr
    stacks = [json.loads(line) for line in dump.read_text().splitlines()]
    assert len(stacks) >= 20
    assert [s for s in stacks if s["truncated"] != "NONE"] == []
    assert not [n for n in result.report["tracing"]["notes"] if OUTSIDE in n]

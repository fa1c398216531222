"""The stack store (bpf/stackstore.h) keeps every distinct stack of a traced process
once, and nothing else: stacks differing only in their top bits get keys of their own,
and other processes calling a probed library take no room (issue 54: GLib's
`performance` ended INCOMPLETE with "two different stacks had the same 64-bit hash",
then with "stack store full")."""

from __future__ import annotations

import json
import os
import subprocess

from conftest import FIXTURES, refcntd
from test_run import lib_spec

FAKE = 64  # garbage return addresses 0x6765 | t << 57; FNV-1a gave them 32 keys at most


def test_stacks_differing_in_top_bits_have_their_own_keys(bpf, build, tmp_path):
    """The kernel's frame-pointer walk records whatever a data-holding rbp points at,
    as ip and as offset: 64 stacks differing in bits 57..62 of one frame are 64 entries,
    none lost as a collision."""
    exe = build.program("fakeframes", [FIXTURES / "fakeframes.c"], "O2")
    dump = tmp_path / "stacks"
    env = {**os.environ, "REFCNTD_UNWIND": "fp", "REFCNTD_DUMP_STACKS": str(dump)}
    result = refcntd(["run", "--", str(exe), str(FAKE)], tmp_path / "r.json", env=env)
    assert result.report["tracing"]["lost"] == {}, result.report["tracing"]
    assert result.returncode == 23, result.stderr  # leaks, and complete
    assert result.report["processes"][0]["leaked_objects"] == FAKE
    stacks = [json.loads(line) for line in dump.read_text().splitlines()]
    garbage = {ip for s in stacks for ip in s["ips"] if ip & ((1 << 57) - 1) == 0x6765}
    assert garbage == {0x6765 | t << 57 for t in range(FAKE)}, sorted(map(hex, garbage))


def test_untraced_processes_take_no_room_in_the_store(bpf, build, tmp_path):
    """Processes outside the run calling the probed library (the rest of a CI machine)
    made hundreds of stacks nobody reports or frees; with 64 entries the traced
    program's 4 stacks found the store full."""
    exe = build.program("stacks", [FIXTURES / "stacks.c"], "O2", shared_stubs=True)
    spec = lib_spec(tmp_path, build.stub_lib("O2"))
    others = subprocess.Popen(["sh", "-c", f"while :; do {exe} 40; done"])
    try:
        result = refcntd(["run", "--max-stacks", "64", "--spec", str(spec), "--",
                          str(exe), "4", "1500"], tmp_path / "r.json")
    finally:
        others.kill()
        others.wait()
    assert result.report["tracing"]["lost"] == {}, result.report["tracing"]
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    assert process["command"] == [str(exe), "4", "1500"]
    assert process["leaked_objects"] == 4
    groups = process["groups"]
    assert len(groups) == 4  # recursion depths 1..4: four stacks, each down to main
    assert all("main" in [f.get("function") for f in g["stack"]] for g in groups), groups

"""GET /leaks on an object held only by a register of a thread stopped while running
(refcntd/reach/deadframes.py): not judged lost, with a note naming the thread, while
an object lost for good in the same process stays definitely lost.  Truth by
construction (tests/fixtures/regheld.c, -O2): the worker puts its object through
that register once main reads a byte, which the test then sends."""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from conftest import EXAMPLES, FIXTURES, cc
from test_serve import Serve, target_yaml


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    out = tmp_path_factory.mktemp("regheld")
    return cc(out / "regheld", [FIXTURES / "regheld.c", EXAMPLES / "refcnt.c"],
              ["-O2", "-fomit-frame-pointer", "-pthread", "-Wl,-z,now"])


def test_an_object_held_in_a_running_threads_register_is_not_judged(bpf, program, tmp_path):
    with Serve(tmp_path, target_yaml("regheld", program)) as serve:
        proc = subprocess.Popen([str(program)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
        assert proc.stdin is not None and proc.stdout is not None
        try:
            printed = ""
            while "READY" not in printed:
                line = proc.stdout.readline()
                assert line, "the fixture ended early"
                printed += line
            time.sleep(0.5)  # the worker past sem_post, spinning
            answer = serve.leaks()
            proc.stdin.write("x")
            proc.stdin.flush()
            put = proc.stdout.readline()
        finally:
            proc.kill()
            proc.wait()
        assert serve.stop() == 0
    made = {m[1]: int(m[2], 16) for m in re.finditer(r"^OBJ (\w+) (0x[0-9a-f]+)$", printed, re.M)}
    (process,) = [p for p in answer["targets"]["regheld"]["run"]["processes"]
                  if p["pid"] == proc.pid]
    listed = {int(i["address"], 16): i["kind"] for g in process["groups"]
              for i in g["instances"]}
    assert listed == {made["lost"]: "definitely lost"}, process
    notes = [n for n in process.get("notes", []) if "not judged lost" in n]
    assert len(notes) == 1 and notes[0].startswith("1 object(s)"), process.get("notes")
    worker = re.search(r"thread (\d+) ", notes[0])
    assert worker is not None and int(worker[1]) != proc.pid, notes  # not main
    assert put == "PUT held\n"  # the register did hold it: the worker put it through it

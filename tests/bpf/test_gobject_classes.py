"""Classes named at exit (reach/gtypes.py) on a GLib program of our own with the bundled
gobject spec, with GSlice (Debian 12's default: G_SLICE set empty, which `run` leaves
as it is) and with G_SLICE=always-malloc: every
leaked object's class is what G_OBJECT_TYPE_NAME said in the program, a factory
making two classes gives two groups with one key, and nothing else is named."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, cc, pkg_config_flags, refcntd, start_hanging
from test_serve import Serve, target_yaml

TRUTH = {"RcdWidget": 2, "RcdGadget": 2, "GObject": 1, "GCancellable": 1}


@pytest.fixture(scope="module")
def program(build) -> Path:
    return cc(build.root / "classes" / "gclasses", [FIXTURES / "gclasses.c"],
              ["-O2", "-fomit-frame-pointer", *pkg_config_flags("gio-2.0")])


@pytest.mark.parametrize("slice_mode", ["", "always-malloc"])
def test_leaked_objects_are_named_by_their_class(bpf, program, tmp_path, slice_mode) -> None:
    env = {**os.environ, "G_SLICE": slice_mode}
    result = refcntd(["run", "--spec", "gobject", "--", str(program)], tmp_path / "r.json",
                     env=env)
    assert result.returncode == 23, result.stderr
    truth = {}
    for line in result.stdout.splitlines():
        if line.startswith("leak "):
            _, name, address = line.split()
            truth[int(address, 16)] = name
    assert sorted(truth.values()) == sorted(n for n, k in TRUTH.items() for _ in range(k))
    (process,) = result.report["processes"]
    named = {int(i["address"], 16): g.get("class_name", "")
             for g in process["groups"] for i in g["instances"]}
    assert named == truth, process["notes"]
    factory = [g for g in process["groups"] if g["stack"][1].get("function") == "make"]
    assert len({str(g["stack"]) for g in factory}) == 1  # one stack, split by class
    assert {g["class_name"] for g in factory} == {"RcdGadget", "RcdWidget"}
    assert {g["type"] for g in process["groups"]} == {"GObject"}
    (held,) = [i for g in process["groups"] if g["class_name"] == "GCancellable"
               for i in g["instances"]]
    # with GSlice its slab's own words point to it too (issue 58: GSlice's slabs)
    assert ["RcdGadget", ".held"] in [p["holder"].split()[::2]
                                      for p in held.get("pointers", [])], held
    text = result.stderr + result.stdout
    assert "of type 'GObject' class 'RcdGadget'" in text
    assert "classes not read" not in text and "could not be read" not in text


def test_without_class_in_the_spec_nothing_is_read(bpf, program, tmp_path) -> None:
    """A spec without `class:` reads no object's memory for it: the type is all."""
    spec = tmp_path / "plain.yaml"
    spec.write_text((ROOT / "configs" / "specs" / "gobject.yaml").read_text()
                    .replace("    class: {gtype: instance}", "    # no class"))
    result = refcntd(["run", "--spec", str(spec), "--", str(program)], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    assert all("class_name" not in g for g in process["groups"])
    assert "object classes read" not in result.stderr


def test_leaks_and_metrics_name_classes_live(bpf, program, tmp_path) -> None:
    """GET /leaks names the lost objects' classes in its stop, and
    refcntd_live_objects_by_class counts the live ones by class (comm: keeps other
    GLib programs on the machine out of the target)."""
    yaml = target_yaml("g", program, "gobject", "    comm: [gclasses]\n")
    with Serve(tmp_path, yaml) as serve:
        url = f"http://127.0.0.1:{serve.port}"
        proc, shown = start_hanging(program, {**os.environ, "G_SLICE": "always-malloc"})
        try:
            time.sleep(0.5)
            with urllib.request.urlopen(f"{url}/leaks", timeout=60) as r:
                answer = json.loads(r.read())
            with urllib.request.urlopen(f"{url}/metrics", timeout=60) as r:
                metrics = r.read().decode()
        finally:
            proc.kill()
            proc.wait()
        assert serve.stop() == 0
    truth = {int(a, 16): n for _, n, a in (line.split() for line in shown.splitlines()[:-1])}
    (process,) = answer["targets"]["g"]["run"]["processes"]
    named = {int(i["address"], 16): g.get("class_name") for g in process["groups"]
             for i in g["instances"]}
    assert named and all(truth[a] == n for a, n in named.items()), (named, truth)
    by_class = {line.split('class="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines()
                if line.startswith("refcntd_live_objects_by_class{")}
    assert by_class == {"RcdWidget": 2, "RcdGadget": 2, "GObject": 1, "GCancellable": 1}

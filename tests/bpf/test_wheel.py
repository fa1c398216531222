"""The wheel works on its own: built from this checkout, installed into a fresh
virtual environment outside it, run from a directory that is not the checkout.

This is what proves that the wheel carries bpf/ and configs/ (pyproject's
package-dir mapping) and that refcntd/paths.py finds them installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from test_run import assert_perflike_truth

# Not part of the wheel's source: copying them would only slow the build down.
SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                              ".pytest_cache", ".ruff_cache", ".mypy_cache", "benchmarks")


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv (seeing Debian's bcc) with only the wheel of this checkout installed."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"  # a copy, so that building leaves no build/ in the checkout
    shutil.copytree(ROOT, src, ignore=SKIP)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(work / "dist"), str(src)],
                   check=True, capture_output=True, text=True)
    wheel, = (work / "dist").glob("refcntd-*.whl")
    venv = work / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)
    subprocess.run([venv / "bin/python", "-m", "pip", "install", "-q",
                    "--disable-pip-version-check", str(wheel)],
                   check=True, capture_output=True, text=True)
    return venv


def run_installed(venv: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(venv / "bin/refcntd"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_wheel_finds_its_data(bpf, wheel_venv, tmp_path):
    out = subprocess.run([wheel_venv / "bin/python", "-c", "import refcntd.paths as p; "
                          "print(p.BPF_DIR); print(p.SPEC_DIR); print(p._PACKAGE)"],
                         cwd=tmp_path, capture_output=True, text=True, check=True)
    bpf_dir, spec_dir, package = map(Path, out.stdout.split())
    # every module of the checkout is in the wheel (pyproject lists the packages)
    modules = {p.relative_to(ROOT / "refcntd") for p in (ROOT / "refcntd").rglob("*.py")}
    assert modules == {p.relative_to(package) for p in package.rglob("*.py")}
    for installed in (bpf_dir, spec_dir):
        assert installed.is_relative_to(wheel_venv), installed  # not the checkout's copy
    # every BPF source: refcntd.c pastes in one header per concern (kernel/program.py)
    assert {p.name for p in bpf_dir.iterdir() if p.suffix in (".c", ".h")} == \
        {p.name for p in (ROOT / "bpf").iterdir()}
    assert (spec_dir / "perf-stubs.yaml").is_file()
    assert (package / "outputs" / "flame.js").is_file()  # package data: the HTML report's code


def test_wheel_check_and_traced_run(bpf, build, wheel_venv, tmp_path):
    exe = build.perflike()
    check = run_installed(wheel_venv, ["check", "--binary", str(exe)], tmp_path)
    assert check.returncode == 0, check.stderr
    spec_line = check.stdout.splitlines()[0]
    assert spec_line.startswith("spec perf-stubs (") and str(wheel_venv) in spec_line, spec_line
    assert "__refcnt__init" in check.stdout

    report = tmp_path / "r.json"
    run = run_installed(wheel_venv, ["run", "--json", str(report), "--", str(exe)], tmp_path)
    assert run.returncode == 23, run.stderr  # leaks found, tracing complete
    data = json.loads(report.read_text())
    assert data["tracing"]["complete"], data["tracing"]
    assert len(data["processes"]) == 1
    assert_perflike_truth(data["processes"][0])
    page = run_installed(wheel_venv, ["report", "--format", "html", str(report)], tmp_path)
    assert page.returncode == 23 and "window.onerror" in page.stdout, page.stderr

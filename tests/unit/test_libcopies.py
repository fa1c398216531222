"""Copies of one library (issue 39, item 2), without the kernel: which files are the
same library, which copy ld.so loads for a program, and how a plan traces it.  The
libraries and programs are built here by Debian's gcc."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from conftest import FIXTURES, LIBRARY_SPEC

from refcntd.binary.elf import ElfImage
from refcntd.binary.libcopies import copy_of, loaded_copy, same_library
from refcntd.binary.plan import build_plan
from refcntd.inputs.spec import load_spec


def buf_spec(library: Path) -> str:
    return LIBRARY_SPEC.format(library=library, type="buf", new="buf_new", ref="buf_ref",
                               unref="buf_unref")


def lib(out: Path, *flags: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-O2", "-g", "-fPIC", "-shared", "-Wl,-soname,libbuf.so", *flags,
                    "-o", str(out), str(FIXTURES / "libbuf.c")], check=True)
    return out


def program(out: Path, libdir: Path) -> Path:
    subprocess.run(["gcc", "-O2", "-g", f"-I{FIXTURES}", "-o", str(out),
                    str(FIXTURES / "bufprog.c"), f"-L{libdir}", "-lbuf",
                    f"-Wl,-rpath,{libdir}"], check=True)
    return out


def test_same_library_by_build_id_or_by_soname_and_contents(tmp_path: Path) -> None:
    a = lib(tmp_path / "a" / "libbuf.so")
    (tmp_path / "b").mkdir()
    b = Path(shutil.copy2(a, tmp_path / "b" / "libbuf.so"))
    other = lib(tmp_path / "c" / "libbuf.so", "-O1")
    assert same_library(ElfImage(a), ElfImage(b))
    assert not same_library(ElfImage(a), ElfImage(other))
    bare = lib(tmp_path / "d" / "libbuf.so", "-Wl,--build-id=none")
    (tmp_path / "e").mkdir()
    bare_copy = Path(shutil.copy2(bare, tmp_path / "e" / "libbuf.so"))
    bare_other = lib(tmp_path / "f" / "libbuf.so", "-Wl,--build-id=none", "-O1")
    assert ElfImage(bare).build_id is None
    assert same_library(ElfImage(bare), ElfImage(bare_copy))
    assert not same_library(ElfImage(bare), ElfImage(bare_other))


def test_the_copy_a_program_loads(tmp_path: Path) -> None:
    a = lib(tmp_path / "a" / "libbuf.so")
    (tmp_path / "b").mkdir()
    b = Path(shutil.copy2(a, tmp_path / "b" / "libbuf.so"))
    prog = program(tmp_path / "prog", b.parent)
    copy = loaded_copy(ElfImage(a), ElfImage(prog))
    assert copy is not None and copy.path == str(b) and copy.same_build
    assert loaded_copy(ElfImage(b), ElfImage(prog)) is None  # that very file
    assert loaded_copy(ElfImage(a), ElfImage("/bin/true")) is None  # not needed at all
    traced = loaded_copy(ElfImage(a), ElfImage(b))  # attach --binary b/libbuf.so
    assert traced is not None and traced.path == str(b) and traced.same_build
    assert copy_of(str(a), ElfImage(a)) is None
    assert copy_of("/usr/lib/x86_64-linux-gnu/libc.so.6", ElfImage(a)) is None  # another name
    found = copy_of(str(b), ElfImage(a))
    assert found is not None and found.same_build


def test_a_plan_traces_the_copy_of_the_same_build(tmp_path: Path) -> None:
    """The spec names a/; the program's RUNPATH loads b/: b/ is probed, a/ not, and a
    note says so; another build at b/ leaves a/ probed, with a note."""
    a = lib(tmp_path / "a" / "libbuf.so")
    (tmp_path / "b").mkdir()
    b = Path(shutil.copy2(a, tmp_path / "b" / "libbuf.so"))
    prog = program(tmp_path / "prog", b.parent)
    (tmp_path / "spec.yaml").write_text(buf_spec(a))
    plan = build_plan(load_spec(str(tmp_path / "spec.yaml")), str(prog))
    assert {s.callee_module or s.module for s in plan.sites} == {str(b)}
    assert plan.named == {str(b): str(a)}
    assert any(f"the spec names {a}; prog loads {b}, the same build" in n for n in plan.notes)
    other = lib(tmp_path / "c" / "libbuf.so", "-O1")
    (tmp_path / "other.yaml").write_text(buf_spec(other))
    plan = build_plan(load_spec(str(tmp_path / "other.yaml")), str(prog))
    assert {s.callee_module or s.module for s in plan.sites} == {str(other)}
    assert any(f"the spec names {other}; prog loads {b}, another build" in n for n in plan.notes)

"""Struct members by offset from DWARF (refcntd/binary/structs.py), on a program gcc
compiles here: nested structs, an array, an anonymous union, a typedef'd struct."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from refcntd.binary.elf import ElfImage
from refcntd.binary.structs import StructNames

SOURCE = r"""
#include <stdlib.h>
struct node { struct node *next, *prev; };
struct inner { long a; struct node links[3]; };
struct outer {
	int refcnt;
	struct inner in;
	union { void *ptr; long bits; };
	char tail[7];
};
typedef struct { void *klass; int count; } Thing;
__attribute__((noinline)) struct outer *outer_new(void) { return calloc(1, sizeof(struct outer)); }
__attribute__((noinline)) Thing *thing_new(void) { return calloc(1, sizeof(Thing)); }
int main(void) { return outer_new() != 0 && thing_new() != 0; }
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> tuple[str, int, int]:
    out = tmp_path_factory.mktemp("structs")
    (out / "s.c").write_text(SOURCE)
    exe = out / "s"
    subprocess.run(["gcc", "-g", "-O2", "-o", str(exe), str(out / "s.c")], check=True)
    image = ElfImage(exe)
    return str(exe), image.symbols["outer_new"][0].vaddr, image.symbols["thing_new"][0].vaddr


@pytest.mark.parametrize("offset, member", [
    (0, ".refcnt"), (8, ".in.a"), (16, ".in.links[0].next"), (24, ".in.links[0].prev"),
    (48, ".in.links[2].next"), (64, ".ptr"), (72, ".tail[0]"), (75, ".tail[3]")])
def test_members_by_offset(program, offset, member):
    path, outer_new, _ = program
    with StructNames() as names:
        assert names.member(path, [outer_new], "outer", offset) == member


def test_a_typedef_of_a_struct_and_what_is_not_there(program, tmp_path):
    path, outer_new, thing_new = program
    with StructNames() as names:
        assert names.member(path, [thing_new], "Thing", 8) == ".count"
        assert names.member(path, [outer_new], "nosuch", 0) is None
        assert names.member(path, [0xdeadbeef], "outer", 0) is None
        assert names.member(str(Path(path).with_name("missing")), [outer_new], "outer", 0) \
            is None
    stripped = tmp_path / "stripped"
    subprocess.run(["strip", "-g", "-o", str(stripped), path], check=True)
    with StructNames() as names:
        assert names.member(str(stripped), [outer_new], "outer", 8) is None

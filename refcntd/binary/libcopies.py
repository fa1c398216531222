"""Copies of one library: the same build sitting in several places.

A spec drafted in one build tree names that tree's file; the test may load
another copy of the same build (a second build directory, the installed copy,
a CI cache).  Uprobes are per file, so probes on the named copy never fire in
a program that maps the other one, and a leaking test would pass clean
(issue 39).  Here: whether two files are the same library (their build-id, or
without one their soname and contents), and which copy ld.so loads for a
program, so that the copy the program runs is the one traced.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from refcntd.binary.callsites import needed
from refcntd.binary.elf import ElfImage, read_build_id
from refcntd.binary.libpaths import resolve_library
from refcntd.errors import BinaryError
from refcntd.inputs import rootpaths

MAX_LOAD_SET = 512  # libraries followed from one program (a real desktop program: ~150)


@dataclass(frozen=True)
class Copy:
    """Another file than the spec's with the spec library's name."""

    path: str
    same_build: bool  # the same library (build-id, or soname and contents): traced instead

    @property
    def relation(self) -> str:
        """How the copy relates to the file the spec names, in a phrase."""
        return "the same build as" if self.same_build else "another build than"


def library_name(image: ElfImage) -> str:
    """The name programs load `image` by: its soname, else its file name."""
    return image.soname() or image.path.name


def same_library(a: ElfImage, b: ElfImage) -> bool:
    """Whether two files are one library: equal build-ids, or (without a build-id on
    either) equal sonames and contents.  The same inode always is."""
    if _same_file(a.path, b.path):
        return True
    if a.build_id or b.build_id:
        return a.build_id == b.build_id
    return a.soname() == b.soname() and _digest(a.path) == _digest(b.path)


def loaded_copy(library: ElfImage, exe: ElfImage) -> Copy | None:
    """The file ld.so loads for `library`'s name when it starts `exe`, if that is another
    file than `library` (None: `exe` does not need it, or needs that very file).  A
    traced library of that name (`attach --binary ./libfoo.so`) is its own copy."""
    name = library_name(library)
    path = rootpaths.resolve(exe.path) if library_name(exe) == name else _find_needed(name, exe)
    if path is None or _same_file(Path(path), library.path):
        return None
    try:
        other = ElfImage(path)
    except BinaryError:
        return None
    return Copy(path, same_library(library, other))


def copy_of(path: str, library: ElfImage) -> Copy | None:
    """`path` (a library a traced process loaded) as a copy of `library`: None when it
    is that file, or another library altogether (another name)."""
    if _same_file(Path(path), library.path):
        return None
    names = {library.path.name, Path(rootpaths.resolve(library.path)).name, library.soname()}
    if Path(path).name not in names and Path(rootpaths.resolve(path)).name not in names:
        return None
    build_id = read_build_id(path)
    if library.build_id or build_id:
        return Copy(path, build_id == library.build_id)
    try:
        return Copy(path, same_library(library, ElfImage(path)))
    except BinaryError:
        return None


def _find_needed(name: str, exe: ElfImage) -> str | None:
    """Breadth first through DT_NEEDED as ld.so loads them: the path resolved for the
    first importer of `name`."""
    queue, seen = [exe], {rootpaths.resolve(exe.path)}
    while queue and len(seen) < MAX_LOAD_SET:
        module = queue.pop(0)
        for soname in needed(module):
            try:
                path = resolve_library(soname, module)
            except BinaryError:
                continue
            if soname == name:
                return path
            if path not in seen:
                seen.add(path)
                with contextlib.suppress(BinaryError):
                    queue.append(ElfImage(path))
    return None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _digest(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None

"""Programs a traced tree execs that carry their own copy of the spec's functions.

`run -- make check`, where each test program links the refcount stubs
statically (perf's layout): only the command and the spec's libraries are
analysed before the start, so a test program's own functions would go
unprobed.  With knob hold_execs the BPF side stops a traced process that
execs a file nobody scanned (bpf/hold.h), before the program runs; here its
symbols are checked for the spec's functions (roles without a library), and a
program that has them is planned like the command (binary/plan.py) and its
probes attached into the spare slots (kernel/program.py EXEC_SPARE_PROBES),
then vetting.py continues it.  Uprobes are per file: a program exec'd again
is stopped no more and counts from its first instruction.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from refcntd.binary.elf import ElfImage
from refcntd.binary.plan import build_plan, defines
from refcntd.binary.probesite import ProbeSite
from refcntd.errors import BinaryError, ConfigError, ConfigErrors, ProbeError
from refcntd.inputs.spec import Spec
from refcntd.kernel.abi import FileKey
from refcntd.kernel.decode import names_file
from refcntd.kernel.parts import Probes


class ExecScanner:
    """Checks each exec'd file once; attaches what a program with the functions needs."""

    def __init__(self, spec: Spec, modes: dict[str, str], probes: Probes,
                 type_ids: Callable[[str], int],
                 on_probed: Callable[[str, list[ProbeSite]], None]) -> None:
        """`on_probed(path, sites)`: a program's probes are attached (the symbolizer and
        the unwinder learn the module)."""
        # the roles whose functions live in executables; library roles are planned already
        self.spec = dataclasses.replace(spec, roles={
            role: tuple(r for r in entries if not r.library and not r.usdt)
            for role, entries in spec.roles.items()})
        self.modes, self.probes, self.type_ids, self.on_probed = modes, probes, type_ids, \
            on_probed
        self.functions = tuple(sorted({f for r in self.spec.entries for f in r.functions}))
        self._seen: set[tuple[int, int]] = set()
        self.probed: dict[str, int] = {}  # program -> probes attached at its exec
        self.problems: list[str] = []  # programs with the functions that are not counted

    def seen(self, keys: list[FileKey]) -> None:
        """Files planned before the start (the command, the spec's libraries)."""
        self._seen |= {(k.dev, k.ino) for k in keys}

    def scan(self, tgid: int, file: FileKey) -> bool:
        """`tgid` was stopped at a mapping of `file`: if that is its new program, probe
        the program's copy of the functions (once per file).  Whether it was."""
        if (file.dev, file.ino) in self._seen:
            return False
        path = _program(tgid, file)
        if path is None:
            return False  # a library mapped later, not an exec
        self._seen.add((file.dev, file.ino))
        if self.functions:
            self._probe(path)
        return True

    def _probe(self, path: str) -> None:
        try:
            if not defines(ElfImage(path), self.functions):
                return
            plan = build_plan(self.spec, path, self.modes)
        except (BinaryError, ConfigError, ConfigErrors, ProbeError) as err:
            self.problems.append(f"{path}: {err}")
            return
        self.problems += [f"{path}: {p}" for p in plan.problems]
        if not plan.sites:
            return
        added = self.probes.add_sites(plan.sites, self.type_ids)
        if not added:
            self.problems.append(f"{path}: its {len(plan.sites)} probe(s) do not fit in the "
                                 "spare probe slots")
            return
        refused = [f for f in self.probes.failed_probes if f.site_index in added]
        if refused:
            self.problems.append(f"{path}: the kernel refused a probe: {refused[0].stage}: "
                                 f"{refused[0].message}")
        self.probed[path] = len(added)
        self.on_probed(path, plan.sites)

    def notes(self) -> list[str]:
        return [f"{n} probe(s) added in {path}, exec'd by the traced tree"
                for path, n in self.probed.items()]


def _program(tgid: int, file: FileKey) -> str | None:
    """The path of `tgid`'s program if it is `file` (else None), as this mount namespace
    names it, or /proc/PID/exe (the same inode) when it names another file."""
    exe = f"/proc/{tgid}/exe"
    if not names_file(exe, file.dev, file.ino):
        return None
    try:
        path = os.readlink(exe)
    except OSError:
        return exe
    return path if names_file(path, file.dev, file.ino) else exe

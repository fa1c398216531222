"""Modules mapped later, for exported functions probed at their call sites (HOLD):
the files already accounted for (vetted, hold_owners), the functions whose address
dlsym must not hand out unseen (hold_funcs), and the processes stopped (held)."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterable

from refcntd.kernel import abi
from refcntd.kernel.maps import take_all
from refcntd.kernel.program import KernelOptions, Program

EXIT_HOLD = (1 << 64) - 1  # hold_key.offset of a process held at _exit (bpf/exithold.h)


class BpfHoldMaps:
    """Does nothing unless the program was compiled to stop processes (`enabled`)."""

    def __init__(self, program: Program, opts: KernelOptions) -> None:
        self.program, self.opts = program, opts

    @property
    def enabled(self) -> bool:
        """Compiled with HOLD: processes mapping unscanned modules are stopped (it needs
        the unwinder's mapping hooks; `opts.hold` alone only reserves probe slots)."""
        return self.opts.hold and self.opts.unwind_offsets is not None

    def vet(self, keys: Iterable[abi.FileKey], owner: bool = False, vetted: bool = True) -> None:
        """Modules whose calls are accounted for: mapping them stops no process.
        `owner`: they define an exported function probed at its call sites (with
        `vetted` False: and their own calls to another such function are not probed yet)."""
        if not self.enabled:
            return
        for key in keys:
            if vetted:
                self.program["vetted"][key] = ctypes.c_uint32(1)
            if owner:
                self.program["hold_owners"][key] = ctypes.c_uint32(1)

    def own_tables(self, keys: Iterable[abi.FileKey]) -> None:
        """The probed modules: a process mapping one while a module it maps has no unwind
        table yet is stopped until user space has loaded the tables (knob hold_tables)."""
        if not (self.enabled and self.opts.hold_tables):
            return
        for key in keys:
            self.program["table_owners"][key] = ctypes.c_uint32(1)

    def take_held(self) -> dict[int, abi.HoldKey]:
        """Processes the BPF side stopped (tgid -> the module it was mapping, or the
        function dlsym returned), forgotten here: the caller must continue each one."""
        if not self.enabled:
            return {}
        return {key.value: value for key, value in take_all(self.program["held"])}

    def held_map_fd(self) -> int:
        """The `held` map's descriptor, for the guardian (session/guardian.py)."""
        return int(self.program["held"].map_fd)

    def hold_function(self, key: abi.HoldKey, on: bool = True) -> None:
        """dlsym returning this function (module, file offset) stops the process."""
        if not self.enabled:
            return
        table = self.program["hold_funcs"]
        if on:
            table[key] = ctypes.c_uint32(1)
        else:
            with contextlib.suppress(KeyError):
                del table[key]

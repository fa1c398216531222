"""Make the BPF program in a thread while the binary is analysed.

From the program cache that takes about 0.05 s, plus the kernel's verification of the
probe programs (0.25-0.7 s here); a compile (3-6 s, only with no cached program:
`refcntd prebuild` makes it) depends on nothing but bpf/, bcc and the kernel.  The
options (the run-time configuration written into the maps, kernel/knobs.py) and the
number of probe slots (a power of two, see program.probe_slots) are known before the
analysis: so attach and run start it first.  bcc's compile and the bpf() calls are
ctypes calls, which release the GIL: the analysis runs meanwhile.  When the analysis
ends with other options (more probes than guessed, holding or not), the early program
is dropped and the right one made again, from the cache.
"""

from __future__ import annotations

import contextlib
import threading
import time

from refcntd.kernel.program import (
    KernelOptions,
    Program,
    compile_program,
    probe_attach_type,
    probe_slots,
)


class BackgroundCompile:
    def __init__(self, opts: KernelOptions, probe_guess: int) -> None:
        self.opts, self.slots = opts, probe_slots(probe_guess)
        self.program: Program | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        self._unwanted = False
        self._thread = threading.Thread(target=self._run, name="bpf-compile", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.monotonic()
        try:
            self.program = compile_program(self.opts, self.slots)
            with contextlib.suppress(Exception):  # refused: Kernel loads again and says why
                self.program.preload(probe_attach_type(self.program.choices),  # as Kernel
                                     lambda: self._unwanted)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            self.error = err
        self.seconds = time.monotonic() - t0

    def take(self, opts: KernelOptions, probe_count: int) -> tuple[Program | None, float]:
        """(the program, seconds waited for it) if it fits (the same options, at least as
        many probe slots); (None, waited) if not.

        Errors of the early compile (no privileges, no headers) are raised here,
        after the analysis has had its say about the binary.  Always waits: two
        bcc compiles at once in one process crash it (clang's state is shared),
        and a cold early compile fills the program cache for the second one
        (map sizes are not part of its key)."""
        fits = opts == self.opts and probe_slots(probe_count) <= self.slots
        self._unwanted = not fits  # stop verifying programs that will be dropped
        t0 = time.monotonic()
        self._thread.join()
        waited = time.monotonic() - t0
        if self.error is not None:
            raise self.error
        if not fits:
            self.discard()
            return None, waited
        program, self.program = self.program, None
        return program, waited

    def discard(self) -> None:
        if self.program is not None:
            self.program.cleanup()
            self.program = None

"""`refcntd prebuild`: compile the BPF programs ahead, so that no start waits for clang.

bcc's compile of bpf/refcntd.c takes 3-4 s here and depends on the kernel and on
a few options (the spec's delete role, run's process filter, serve's and
attach's per-site counts, holding processes for exported call sites).  Once
compiled, a start loads the programs from the cache without bcc
(kernel/progcache.py).  This compiles the combinations the bundled specs give
for `attach`, `run` and `serve`; scripts/setup.sh runs it after installing, and
it belongs after a kernel or bcc upgrade.  Other combinations (--history, a
cgroup filter) are compiled at their first start and cached as before.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from refcntd.inputs.spec import load_spec
from refcntd.kernel import setup
from refcntd.kernel.program import KernelOptions, compile_program
from refcntd.paths import CACHE_DIR, SPEC_DIR
from refcntd.session.options import TraceOptions, kernel_options

# (commands, their process filter, their per-site counts)
COMMANDS = (("attach/serve", False, True), ("run", True, False))


def cmd_prebuild(args: argparse.Namespace) -> int:
    setup.prepare()
    specs = [load_spec(str(path)) for path in sorted(SPEC_DIR.glob("*.yaml"))]
    done: list[KernelOptions] = []  # not a set: the options hold a dict
    for spec in specs:
        for command, filtered, sites in COMMANDS:
            for hold in (False, True):
                kopts = replace(kernel_options(spec, True, filtered, TraceOptions(sites=sites)),
                                hold=hold)
                if kopts in done:
                    continue
                done.append(kopts)
                t0 = time.monotonic()
                program = compile_program(kopts, 16)
                program.cleanup()
                if not args.quiet:
                    print(f"{command}, {'delete role' if spec.has_delete else 'no delete role'}"
                          f"{', holding' if hold else ''}: {program.how} "
                          f"({time.monotonic() - t0:.1f} s)")
    if not args.quiet:
        print(f"{len(done)} program variants ready in {CACHE_DIR / 'bpf'}")
    return 0

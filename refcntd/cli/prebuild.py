"""`refcntd prebuild`: compile the BPF program ahead, so that no start waits for clang.

bcc's compile of bpf/refcntd.c takes 3-6 s here.  One compiled program serves every
option set: the compile flags only size maps, and everything else (a process filter,
the spec's delete role, per-site counts, history, holding, comm and cgroup filters)
is the program's run-time configuration (kernel/knobs.py).  So this compiles once,
then has the kernel verify the programs as `run`, `attach`/`serve` and `run
--history` configure them, so that a verifier refusal shows here rather than at a
user's first start.  scripts/setup.sh runs it after installing; it belongs after a
kernel or bcc upgrade.  A start from the cache loads the programs without bcc
(kernel/progcache.py); REFCNTD_NO_COMPILE=1 makes a start that would compile fail.
"""

from __future__ import annotations

import argparse
import time

from refcntd.errors import EnvironmentProblem
from refcntd.inputs.spec import load_spec
from refcntd.kernel import setup
from refcntd.kernel.program import compile_program, probe_attach_type
from refcntd.paths import CACHE_DIR, SPEC_DIR
from refcntd.session.options import TraceOptions, kernel_options
from refcntd.session.unwind import prebuild_common
from refcntd.session.vetting import with_holds

# (label, process filter, per-site counts, holding, history): what each command configures
CONFIGURATIONS = (("run", True, False, False, None),
                  ("attach/serve", False, True, True, None),
                  ("run --history all", True, False, False, ("all",)))


def cmd_prebuild(args: argparse.Namespace) -> int:
    setup.prepare()
    spec = load_spec(str(SPEC_DIR / "perf-stubs.yaml"))  # any spec: the options do not key
    for label, filtered, sites, hold, history in CONFIGURATIONS:
        kopts = with_holds(kernel_options(spec, True, filtered,
                                          TraceOptions(sites=sites, history=history)), hold,
                           execs=filtered)  # run probes what its tree execs
        t0 = time.monotonic()
        program = compile_program(kopts, 16)
        try:
            program.preload(probe_attach_type(program.choices))  # the verifier's say, as run
        except OSError as err:
            raise EnvironmentProblem(f"the kernel refused the BPF programs as {label} "
                                     f"configures them: {err}",
                                     "report this with `uname -r` and the output of "
                                     "`refcntd check --verbose`") from None
        finally:
            program.cleanup()
        if not args.quiet:
            print(f"{label}: {program.how}, verified ({time.monotonic() - t0:.1f} s)")
    tables = prebuild_common()
    if not args.quiet:
        print(f"1 program variant ready in {CACHE_DIR / 'bpf'} (every option set)")
        print(f"unwind tables cached: {', '.join(tables) or 'none'}")
    return 0

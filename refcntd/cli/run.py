"""`refcntd run -- CMD`: the CI audit; the exit status says whether CMD leaked."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from refcntd.cli import argtypes
from refcntd.cli.options import (
    ci_arguments,
    leak_kind_arguments,
    output_arguments,
    progress_arguments,
    spec_arguments,
)
from refcntd.errors import UsageError

HELP = "run a command under the tracer; exit status says if it leaked"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    spec_arguments(parser)
    output_arguments(parser)
    progress_arguments(parser)
    parser.add_argument("--wait-descendants", type=argtypes.WAIT_SECONDS, default=10.0,
                        metavar="SECONDS",
                        help="after the command exits, wait this long for its traced "
                             "descendants (default 10)")
    parser.add_argument("--user", type=argtypes.credentials, metavar="USER[:GROUP]",
                        help="run CMD as this user (and group), without privileges, while "
                             "refcntd keeps its own (like strace -u); the environment is kept")
    ci_arguments(parser)
    leak_kind_arguments(parser)
    parser.add_argument("--pprof", metavar="FILE", type=argtypes.output_path,
                        help="also write the leaked objects as a gzip'd pprof profile")
    parser.add_argument("--html", metavar="FILE", type=argtypes.output_path,
                        help="also write the report as one self-contained HTML page "
                             "(as `refcntd report --format html`)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")


def run(args: argparse.Namespace) -> int:
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        raise UsageError("no command given", "usage: refcntd run [options] -- CMD [ARGS...]")
    from refcntd.cli.early import early_compile, history_options
    from refcntd.inputs.spec import load_specs
    from refcntd.kernel import setup
    from refcntd.outputs.policy import Policy
    from refcntd.session.options import TraceOptions
    opts = TraceOptions(max_objects=args.max_objects, descendant_grace_s=args.wait_descendants,
                        max_stacks=args.max_stacks, run_as=args.user, scan_execs=True,
                        leak_kinds=args.leak_kinds,
                        **history_options(args))
    policy = Policy.build(args.suppressions, args.baseline, args.max_leaks)
    policy.lsan = args.leak_kinds
    if args.leak_kinds:  # GLib < 2.76's slabs hold many objects per block: no kinds there
        os.environ.setdefault("G_SLICE", "always-malloc")
    policy.fail_on_reachable = "reachable" in args.fail_on
    policy.judge_killed = args.judge_killed
    exe = os.path.abspath(_resolve_command(command[0]))  # before bcc's compile changes cwd
    spec = load_specs(args.spec)
    spec = spec.scanned() if args.leak_kinds else spec  # the scan reads what checks would
    setup.prepare()  # before the early compile: it needs the kernel headers
    setup.require_host_pids()
    early = early_compile(spec, True, opts, exe)
    # the analysis and tracing modules load while the compile runs
    from refcntd.binary.sitemode import parse_modes
    from refcntd.cli.common import (
        baseline_judge,
        ci_outputs,
        emit,
        finish_output,
        judge_against_baseline,
        judged,
        printer,
        run_exit_status,
    )
    from refcntd.cli.stages import analyse
    from refcntd.session.exitscan import NOT_SCANNED
    from refcntd.session.run import run_command
    plan = analyse(spec, exe, parse_modes(args.probe_mode), execs_later=True)
    plan.require_complete()
    if plan.deferred:
        stripped = " (stripped: no .symtab)" if not next(iter(plan.modules.values())).has_symtab \
            else ""
        plan.notes.append(f"{exe}{stripped} has none of the spec's functions "
                          f"({', '.join(plan.deferred)}): each program the command runs is "
                          "probed at its exec if it has them")
    judge = baseline_judge(policy)  # each report printed judged, as the JSON has it
    result = run_command(plan, command, opts, judged(printer(sys.stderr), judge, sys.stderr),
                         early)
    judge_against_baseline(result, policy, sys.stderr, judge)
    policy.lsan &= not any(n.startswith(NOT_SCANNED) for n in result.tracing.notes)
    result.leak_kinds = policy.lsan  # saved: `report` judges the run the same way
    verdict = policy.evaluate(result)
    finish_output(result, args, sys.stderr)
    if args.pprof:
        from refcntd.outputs.pprof import write_profile
        write_profile(result, args.pprof)
    if args.html:
        from refcntd.outputs.html import render_html
        emit(render_html([result]), args.html)
    ci_outputs(result, verdict, args, sys.stderr)
    return run_exit_status(result, verdict, args.exitcode, args.strict)


def _resolve_command(name: str) -> str:
    """The ELF file that will run: the command, or a script's interpreter."""
    found = name if "/" in name else shutil.which(name)
    if not found or not Path(found).exists():
        raise UsageError(f"command not found: {name}")
    if not Path(found).is_file() or not os.access(found, os.X_OK):  # exec would fail: 126
        raise UsageError(f"command not executable: {name}", "check its mode (chmod +x)")
    interpreter = _shebang(found)
    return _resolve_command(interpreter) if interpreter else found


def _shebang(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if not words:
        return None
    return words[1] if Path(words[0]).name == "env" and len(words) > 1 else words[0]

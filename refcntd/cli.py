"""Command line: `refcntd check | attach | run`.  main() is the one exit point."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from refcntd import __version__, report
from refcntd.config import DEFAULT_CONFIG, load_config
from refcntd.elf import ElfImage
from refcntd.errors import EXIT_FINDINGS, EXIT_INCOMPLETE, RefcntdError, UsageError
from refcntd.model import ProcessReport, RunResult

# CI formats, policies and saved runs are imported where used: `attach` must
# reach its probes fast (attach time is a benchmark goal).
if TYPE_CHECKING:
    from refcntd.policy import Verdict
from refcntd.plan import Plan, build_plan
from refcntd.procmem import semaphore_value
from refcntd.sdt import semaphore_file_offset
from refcntd.spec import load_spec
from refcntd.tracer import TraceOptions, attach, run_command


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own exit, made one line
        raise UsageError(message, f"see `{self.prog} --help`")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="refcntd", description="Reference-count leak tracer (uprobes + BPF)")
    parser.add_argument("--version", action="version", version=f"refcntd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    check = sub.add_parser("check", help="show what would be probed and how, without tracing")
    check.add_argument("--binary", required=True, help="executable or shared library")
    check.add_argument("--pid", type=int, help="also show the USDT semaphore values of this "
                                               "live process")
    _spec_arg(check)

    att = sub.add_parser("attach", help="trace a binary system-wide (or one pid) until Ctrl-C")
    att.add_argument("--binary", required=True, help="executable or shared library to probe")
    att.add_argument("--pid", type=int, help="only this process and its descendants")
    _spec_arg(att)
    _output_args(att)

    run = sub.add_parser("run", help="run a command under the tracer; exit status says if "
                                     "it leaked")
    _spec_arg(run)
    _output_args(run)
    run.add_argument("--wait-descendants", type=float, default=10.0, metavar="SECONDS",
                     help="after the command exits, wait this long for its traced "
                          "descendants (default 10)")
    _ci_args(run)
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")

    rep = sub.add_parser("report", help="render a saved run (--json) again")
    rep.add_argument("run_json", metavar="RUN.json")
    rep.add_argument("--format", choices=("text", "sarif", "junit", "github"), default="text")
    rep.add_argument("--output", metavar="FILE", help="write there instead of stdout")
    _ci_args(rep)

    serve = sub.add_parser("serve", help="trace configured programs continuously; export "
                                         "Prometheus metrics and write reports")
    serve.add_argument("--config", default=str(DEFAULT_CONFIG),
                       help=f"YAML config (default {DEFAULT_CONFIG})")
    serve.add_argument("--strict", action="store_true",
                       help="exit if any target cannot be attached")
    serve.add_argument("--check", action="store_true",
                       help="only check the config file and exit")
    return parser


def _spec_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", default="perf-stubs",
                   help="bundled spec name or YAML file (default: perf-stubs)")


def _ci_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sarif", metavar="FILE", help="also write SARIF 2.1.0")
    p.add_argument("--junit", metavar="FILE", help="also write JUnit XML")
    p.add_argument("--suppressions", metavar="FILE",
                   help="rules (leak:, type:, anomaly:) for findings that must not fail")
    p.add_argument("--baseline", metavar="OLD.json",
                   help="fail only on findings absent from this earlier run")
    p.add_argument("--max-leaks", action="append", default=[], metavar="TYPE=N",
                   help="fail only above N leaked objects of TYPE (* for any type)")
    p.add_argument("--exitcode", type=int, default=EXIT_FINDINGS, metavar="N",
                   help=f"exit status when findings fail the run (default {EXIT_FINDINGS})")
    p.add_argument("--source-root", default=".", metavar="DIR",
                   help="the user's source tree: SARIF and annotations point into it "
                        "(default: the current directory)")


def _output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    p.add_argument("--history", nargs="?", const="all", metavar="TYPES",
                   help="keep each object's get/put stacks and name the likely culprit of "
                        "each leak: 'all' (the default when given) or a comma-separated "
                        "list of type names; costs a stack walk per get/put")
    p.add_argument("--history-depth", type=int, default=16, metavar="N",
                   help="operations kept per object, oldest first (power of two, "
                        "4..256; default 16); the rest are counted as dropped")
    p.add_argument("--max-objects", type=int, default=1 << 20,
                   help="object map capacity (default 1048576)")
    p.add_argument("--max-stacks", type=int, default=8192,
                   help="stack store capacity (default 8192 distinct stacks)")


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        commands = {"check": cmd_check, "attach": cmd_attach, "run": cmd_run, "serve": cmd_serve,
                    "report": cmd_report}
        return commands[args.command](args)
    except RefcntdError as err:
        print(err.line(), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130


def entry() -> None:
    sys.exit(main())


# ---- check --------------------------------------------------------------------
def cmd_check(args: argparse.Namespace) -> int:
    plan = build_plan(load_spec(args.spec), args.binary)
    if args.pid is not None and not Path(f"/proc/{args.pid}").exists():
        raise UsageError(f"no process {args.pid}")
    print(render_check(plan, args.pid))
    return EXIT_INCOMPLETE if plan.problems else 0


def render_check(plan: Plan, pid: int | None = None) -> str:
    lines = [f"spec {plan.spec.name} ({plan.spec.path})"]
    for mod in plan.modules.values():
        lines += [f"module {mod.path}",
                  f"  build-id: {mod.build_id or 'none (stacks resolvable only while it runs)'}",
                  f"  frame pointers: {mod.frame_pointers}",
                  f"  symbol table: {'.symtab and .dynsym' if mod.has_symtab else '.dynsym only'}"]
        lines += render_usdt(plan, mod.path, pid)
    for site in plan.sites:
        lines.append(f"{site.role:<6} {site.function} at 0x{site.symbol_vaddr:x}: probe "
                     f"+{site.probe_offset} (file offset 0x{site.file_offset:x}, {site.cost}"
                     f"{', return probe' if site.is_return else ''})")
        lines.append(f"         why: {site.reason}")
        caller = ("in the kernel's stack walk" if site.caller_sp_offset < 0
                  else f"read from [rsp+{site.caller_sp_offset}] at the probe")
        lines.append(f"         caller: {caller}")
    lines += [f"note: {n}" for n in plan.notes]
    lines += [f"PROBLEM: {p}" for p in plan.problems]
    lines.append("result: " + ("cannot trace: a required probe cannot be placed"
                               if plan.problems else "every role can be probed"))
    return "\n".join(lines)


def render_usdt(plan: Plan, module: str, pid: int | None) -> list[str]:
    """The module's SDT probes, which spec role each serves, and live semaphore values."""
    probes = plan.usdt.get(module, [])
    if not probes:
        return ["  usdt probes: none"]
    image = ElfImage(module)
    roles = {r.usdt: r.role for r in plan.spec.roles.values() if r.usdt}
    lines = [f"  usdt probes: {len(probes)}"]
    for p in probes:
        sema = f"semaphore 0x{p.semaphore:x}" if p.semaphore else "no semaphore"
        used = f" -> {roles[p.full_name]}" if p.full_name in roles else ""
        lines.append(f"    {p.full_name} at 0x{p.pc:x}, {sema}, args: {p.arg_text or '-'}{used}")
        if pid is not None and p.semaphore:
            value = semaphore_value(pid, module, semaphore_file_offset(image, p))
            shown = "not mapped writable" if value is None else str(value)
            lines.append(f"      semaphore in pid {pid}: {shown}")
    return lines


# ---- run / attach ---------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        raise UsageError("no command given", "usage: refcntd run [options] -- CMD [ARGS...]")
    from refcntd.policy import Policy
    opts = TraceOptions(max_objects=args.max_objects, descendant_grace_s=args.wait_descendants,
                        max_stacks=args.max_stacks, **history_options(args))
    policy = Policy.build(args.suppressions, args.baseline, args.max_leaks)
    exe = _resolve_command(command[0])
    plan = build_plan(load_spec(args.spec), exe)
    plan.require_complete()
    result = run_command(plan, command, opts, _printer(sys.stderr))
    verdict = policy.evaluate(result)
    _finish_output(result, args, sys.stderr)
    _ci_outputs(result, verdict, args, sys.stderr)
    return run_exit_status(result, verdict, args.exitcode)


def run_exit_status(result: RunResult, verdict: Verdict, findings_code: int = EXIT_FINDINGS
                    ) -> int:
    """Failing findings beat everything; then incompleteness; else the command's status."""
    if verdict.failing():
        return findings_code
    if not result.tracing.complete:
        return EXIT_INCOMPLETE
    return result.command_status or 0


def cmd_report(args: argparse.Namespace) -> int:
    from refcntd import ciformats
    from refcntd.policy import Policy
    from refcntd.runjson import load_run
    result = load_run(args.run_json)
    verdict = Policy.build(args.suppressions, args.baseline, args.max_leaks).evaluate(result)
    root = Path(args.source_root)
    if args.format == "text":
        text = "".join(report.render_process(p) + "\n" for p in result.processes)
        text += report.render_run(result) + ciformats.verdict_text(verdict)
    elif args.format == "sarif":
        text = json.dumps(ciformats.sarif(result, verdict, root), indent=2) + "\n"
    elif args.format == "junit":
        text = ciformats.junit(result, verdict)
    else:
        text = "\n".join(ciformats.github_annotations(result, verdict, root)) + "\n"
        text += ciformats.github_summary(result, verdict)
    _emit(text, args.output)
    _ci_outputs(result, verdict, args, sys.stderr, annotate=False)
    return run_exit_status(result, verdict, args.exitcode)


def _emit(text: str, path: str | None) -> None:
    if path is None:
        sys.stdout.write(text)
        return
    try:
        Path(path).write_text(text)
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror}") from None


def _ci_outputs(result: RunResult, verdict: Verdict, args: argparse.Namespace,
                stream: TextIO, annotate: bool = True) -> None:
    """--sarif, --junit, and GitHub annotations + step summary under GitHub Actions."""
    from refcntd import ciformats
    root = Path(args.source_root)
    if args.sarif:
        _emit(json.dumps(ciformats.sarif(result, verdict, root), indent=2) + "\n", args.sarif)
    if args.junit:
        _emit(ciformats.junit(result, verdict), args.junit)
    if annotate:
        print(ciformats.verdict_text(verdict), file=stream, end="")
        if os.environ.get("GITHUB_ACTIONS") == "true":
            ciformats.write_github(result, verdict, root, sys.stdout)


def cmd_attach(args: argparse.Namespace) -> int:
    opts = TraceOptions(max_objects=args.max_objects, max_stacks=args.max_stacks,
                        **history_options(args))
    plan = build_plan(load_spec(args.spec), args.binary)
    plan.require_complete()
    ready = lambda: print(f"refcntd: attached to {args.binary}; Ctrl-C to detach",  # noqa: E731
                          file=sys.stderr, flush=True)
    result = attach(plan, args.pid, opts, _printer(sys.stdout), ready)
    _finish_output(result, args, sys.stdout)
    return 0 if result.tracing.complete else EXIT_INCOMPLETE


def history_options(args: argparse.Namespace) -> dict:
    depth = args.history_depth
    if depth < 4 or depth > 256 or depth & (depth - 1):
        raise UsageError(f"--history-depth {depth}: must be a power of two in 4..256")
    if args.history is None:
        return {"history": None, "history_depth": depth}
    names = tuple(n.strip() for n in args.history.split(",") if n.strip())
    if not names:
        raise UsageError("--history: give 'all' or type names")
    return {"history": ("all",) if "all" in names else names, "history_depth": depth}


def cmd_serve(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry, ProcessCollector

    from refcntd import httpserver
    from refcntd.daemon import Daemon, setup_logging
    config = load_config(args.config)
    if args.check:
        print(f"{config.path}: ok, {len(config.targets)} target(s), metrics on "
              f"{config.listen_host}:{config.listen_port}, reports in {config.report_dir}")
        return 0
    setup_logging()
    daemon = Daemon(config, strict=args.strict)
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    registry.register(daemon.collector())
    try:
        httpserver.start(config.listen_host, config.listen_port, registry)
    except OSError as err:
        raise UsageError(f"cannot listen on {config.listen_host}:{config.listen_port}: "
                         f"{err.strerror}", f"change 'listen' in {config.path}") from None
    try:
        daemon.attach_all()
    except RefcntdError:
        daemon.shutdown()
        raise
    daemon.run()
    return 0


def _resolve_command(name: str) -> str:
    """The ELF file that will run: the command, or a script's interpreter."""
    found = name if "/" in name else shutil.which(name)
    if not found or not Path(found).exists():
        raise UsageError(f"command not found: {name}")
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


def _printer(stream: TextIO) -> Callable[[ProcessReport], None]:
    def show(p: ProcessReport) -> None:
        print(report.render_process(p), file=stream, flush=True)
    return show


def _finish_output(result: RunResult, args: argparse.Namespace, stream: TextIO) -> None:
    print(report.render_run(result), file=stream, end="", flush=True)
    if args.json:
        try:
            report.write_json(result, args.json)
        except OSError as err:
            raise UsageError(f"cannot write {args.json}: {err.strerror}") from None


if __name__ == "__main__":
    entry()

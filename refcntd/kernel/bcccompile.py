"""bcc's compile of bpf/refcntd.c, run in a child process: the one module that calls bcc.

Why a child: after a failed compile, libbcc 0.26 can crash the process in
`bpf_module_create_c_from_string` (seen with Debian's split headers: exit 139 and
no word from refcntd).  In a child, a crash or a compile error becomes one line
naming clang's first error, and the diagnostics are kept in a file the line names.
The child is forked (bcc is imported before, in the parent: a fork never imports
anything a thread of the parent might hold the import lock of) and sends back
what the cache keeps: map descriptions, the BTF blob and each program's relocatable
instructions.  Nothing of bcc outlives it; the parent makes its own maps from these.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import pickle
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from refcntd.errors import EnvironmentProblem, RefcntdError
from refcntd.kernel import abi, bpfsys, progcache

HEADERS_REMEDY = "check the kernel headers: `refcntd check` names them"


@dataclass(frozen=True)
class Compiled:
    """What a compile produced, as plain data (pickled from the child)."""

    names: tuple[str, ...]  # the maps, in bcc's order
    specs: tuple[progcache.MapSpec, ...]
    btf: bytes
    functions: dict[str, progcache.Function] | None  # None: maps only asked for
    checked: frozenset[str]  # the structs compared with abi.py


def compile_in_child(source: str, cflags: list[str], functions: bool,
                     log_dir: Path) -> Compiled:
    """bcc's compile of `source` in a forked child; EnvironmentProblem when it fails or
    the child dies (clang's diagnostics are then in `log_dir`/compile-error.txt)."""
    import_bcc()
    read_fd, write_fd = os.pipe()
    with tempfile.TemporaryFile() as diagnostics:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(read_fd)
            _child(source, cflags, functions, write_fd, diagnostics.fileno())
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            payload = pipe.read()
        _, status = os.waitpid(pid, 0)
        diagnostics.seek(0)
        text = diagnostics.read().decode(errors="replace")
    return _answer(payload, status, text, log_dir)


def _child(source: str, cflags: list[str], functions: bool, out: int, err: int) -> None:
    """Compile, send (ok, result) or (error, message, remedy) down `out`, exit."""
    code = 0
    faulthandler.disable()  # a crash here is expected and reported by the parent
    try:
        os.dup2(err, 1)  # clang and bcc print their diagnostics: the parent reads them
        os.dup2(err, 2)
        result: tuple[Any, ...] = ("ok", _compile(source, cflags, functions))
    except RefcntdError as problem:
        result = ("error", problem.message, problem.remedy)
    except BaseException as exc:  # noqa: BLE001 - bcc raises bare Exception; sent as text
        result = ("failed", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    try:
        with os.fdopen(out, "wb") as pipe:
            pipe.write(pickle.dumps(result))
    except BaseException:  # noqa: BLE001 - the parent sees the missing answer
        code = 1
    os._exit(code)


def _answer(payload: bytes, status: int, diagnostics: str, log_dir: Path) -> Compiled:
    first = first_error(diagnostics)
    if payload:
        result = pickle.loads(payload)  # noqa: S301 - our own child's answer, over a pipe
        if result[0] == "ok":
            return result[1]  # type: ignore[no-any-return]
        if result[0] == "error":
            raise EnvironmentProblem(result[1], result[2])
        what = f"clang: {first}" if first else result[1]
    else:
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
        name = signal.Signals(sig).name if sig else f"exit {os.waitstatus_to_exitcode(status)}"
        what = f"bcc's compile crashed ({name})" + (f" after clang: {first}" if first else "")
    kept = _keep(diagnostics, log_dir)
    raise EnvironmentProblem(f"the BPF program failed to compile: {what}",
                             HEADERS_REMEDY + (f"; clang's output is in {kept}" if kept else ""))


def first_error(diagnostics: str) -> str:
    """clang's first `error:` line, without the long path of bcc's virtual files."""
    for line in diagnostics.splitlines():
        if "error:" in line:
            return line.replace("/virtual/main.c", "refcntd.c").strip()
    return ""


def _keep(diagnostics: str, log_dir: Path) -> Path | None:
    if not diagnostics.strip():
        return None
    path = log_dir / "compile-error.txt"
    with contextlib.suppress(OSError):
        log_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(diagnostics)
        return path
    return None


def _compile(source: str, cflags: list[str], functions: bool) -> Compiled:
    """In the child: bcc's compile, and what the parent needs of it."""
    import bcc
    bpf = bcc.BPF(text=source.encode(), cflags=cflags)
    checked = frozenset(_check_layout(bpf))
    names = _map_names(bpf)
    fds = {name: bpf[name.encode()].map_fd for name in names}
    infos = {name: bpfsys.map_info(fd) for name, fd in fds.items()}
    btf_ids = {info.btf_id for info in infos.values() if info.btf_id}
    btf = bpfsys.btf_blob(btf_ids.pop()) if len(btf_ids) == 1 else b""
    specs = tuple(progcache.MapSpec(name, info.type, info.key_size, info.value_size,
                                    info.max_entries, info.map_flags,
                                    info.btf_key_type_id if btf else 0,
                                    info.btf_value_type_id if btf else 0)
                  for name, info in infos.items())
    funcs = _functions(bpf, fds) if functions else None
    return Compiled(tuple(names), specs, btf, funcs, checked)


def import_bcc() -> Any:
    try:
        import bcc
    except ImportError as err:
        raise EnvironmentProblem(f"bcc is not importable ({err})",
                                 "install python3-bpfcc and use a venv made from /usr/bin/python3 "
                                 "that sees it (--system-site-packages, or a link "
                                 "to its bcc folder as scripts/setup.sh makes)") from None
    return bcc


def _functions(bpf: Any, fds: dict[str, int]) -> dict[str, progcache.Function]:
    from bcc.libbcc import lib
    names_by_fd = {fd: name for name, fd in fds.items()}
    functions = {}
    try:
        for i in range(lib.bpf_num_functions(bpf.module)):
            raw = lib.bpf_function_name(bpf.module, i)
            code = ctypes.string_at(lib.bpf_function_start(bpf.module, raw),
                                    lib.bpf_function_size(bpf.module, raw))
            functions[raw.decode()] = progcache.capture(code, names_by_fd)
    except progcache.Unrelocatable as err:
        raise EnvironmentProblem(f"the compiled BPF program refers to something other than "
                                 f"its maps ({err}): refcntd cannot load it",
                                 "report this with `refcntd check --verbose`") from None
    return functions


def _map_names(bpf: Any) -> list[str]:
    from bcc.libbcc import lib
    lib.bpf_num_tables.restype = ctypes.c_ulonglong  # in libbcc, not declared by bcc's Python
    lib.bpf_num_tables.argtypes = [ctypes.c_void_p]
    lib.bpf_table_name.restype = ctypes.c_char_p
    lib.bpf_table_name.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong]
    return [lib.bpf_table_name(bpf.module, i).decode()
            for i in range(lib.bpf_num_tables(bpf.module))]


def _check_layout(bpf: Any) -> set[str]:
    """Every map whose key or value is a struct of bpf/refcntd.h must match abi.py exactly.

    Returns the structs compared, so a test can see the check really ran.
    """
    mirrors = dict(abi.STRUCTS)
    mirrors["hist_val"] = abi.hist_val_type()  # as compiled: abi.HISTORY_DEPTH entries
    checked: set[str] = set()
    for name in _map_names(bpf):
        table = bpf[name.encode()]
        for what, theirs in (("key", table.Key), ("value", table.Leaf)):
            if theirs.__name__.rsplit("_Array_", 1)[-1].isdigit():  # per-CPU values
                theirs = theirs._type_
            mine = mirrors.get(theirs.__name__)
            if mine is None:
                continue
            checked.add(theirs.__name__)
            problem = layout_difference(mine, theirs)
            if problem:
                raise EnvironmentProblem(
                    f"map {name}: {what} struct {theirs.__name__} differs between "
                    f"bpf/refcntd.h as compiled and refcntd/kernel/abi.py: {problem}",
                    "run `python -m refcntd.kernel.abigen` after changing the header")
    return checked


def layout_difference(mine: Any, theirs: Any, prefix: str = "") -> str:
    """'' when both ctypes layouts have the same fields at the same offsets and sizes.

    bcc's Python decoder keeps only the outer dimension of a 2-D array
    (`char argv[8][128]` arrives as `char[8]`): such a field is compared by
    offset and outer length, and the struct's total size is then not comparable.
    """
    if not hasattr(mine, "_fields_"):
        if ctypes.sizeof(mine) != ctypes.sizeof(theirs):
            return f"{prefix.rstrip('.') or 'size'}: {ctypes.sizeof(mine)} vs " \
                   f"{ctypes.sizeof(theirs)} bytes"
        return ""
    ours = [f[0] for f in mine._fields_]
    their_types = {f[0]: f[1] for f in getattr(theirs, "_fields_", [])
                   if not f[0].startswith("__pad")}  # bcc names its own padding
    if ours != list(their_types):
        return f"{prefix}fields {ours} vs {list(their_types)}"
    collapsed = False
    for name, sub in mine._fields_:
        a, b = getattr(mine, name), getattr(theirs, name)
        if a.offset != b.offset:
            return f"{prefix}{name}: offset {a.offset} vs {b.offset}"
        if _collapsed_2d(sub, their_types[name]):
            collapsed = True
            continue
        problem = layout_difference(sub, their_types[name], f"{prefix}{name}.")
        if problem:
            return problem
    if not collapsed and ctypes.sizeof(mine) != ctypes.sizeof(theirs):
        return f"{prefix or 'size: '}{ctypes.sizeof(mine)} vs {ctypes.sizeof(theirs)} bytes"
    return ""


def _collapsed_2d(mine: Any, theirs: Any) -> bool:
    inner = getattr(mine, "_type_", None)
    return (hasattr(inner, "_length_") and getattr(theirs, "_length_", None) == mine._length_
            and not hasattr(getattr(theirs, "_type_", None), "_length_"))

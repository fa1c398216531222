"""The corpus of real programs for benchmarks/corpus.py: what runs, under which spec,
and what the truth is.

Every program is Debian's own binary, run unmodified.  `truth` says what a
correct refcntd reports:

* "clean": upstream runs the program under sanitizers or valgrind, or it is a
  short command-line tool that frees what it makes (GLib's installed tests,
  gio/gsettings/gdbus, OpenSSL's apps, curl, virsh on the test driver,
  cairo's users): any leak, anomaly or INCOMPLETE is a false finding;
* "gst-leaks": GStreamer's own leaks tracer (GST_TRACERS=leaks), run on the
  same pipeline without refcntd: refcntd must report as many leaked objects
  as the tracer lists alive at gst_deinit();
* "leak": a program that leaks for real, as valgrind memcheck shows on the same
  command (REAL_LEAKS names the evidence): the run must fail with a leak;
* "unaudited": a test whose processes never load the library its spec probes
  (a Python script running Python tools, checked by `strace -f` on an untraced
  run): refcntd must say it audited nothing: a complete run with the one note
  "nothing of the spec's library was loaded" (issue 54; before it, INCOMPLETE
  "no probe fired", issue 39's rule, which a run of then is still judged by).

`fixtures(work)` makes the input files (keys, certificates, an SVG, a PDF,
an Ogg file) with the same tools, untraced, before the corpus runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

GLIB_TESTS = Path("/usr/share/installed-tests/glib")
GLIB_TIMEOUT_S = 60  # a test that does not pass within this without refcntd is left out
GOBJECT_LIB = "libgobject-2.0.so.0"
GLIB_LIB = "libglib-2.0.so.0"


@dataclass(frozen=True)
class Program:
    family: str
    name: str
    spec: str
    argv: tuple[str, ...]
    truth: str = "clean"  # or "gst-leaks", "leak", "unaudited"
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: int = 300


def openssl(work: Path) -> list[Program]:
    w = str(work)
    ossl = ("openssl",)
    srv = (f"openssl s_server -naccept 1 -accept 127.0.0.1:{{port}} -cert {w}/srv.pem "
           f"-key {w}/srv.key -www -quiet")
    wait = "for i in $(seq 100); do ss -ltn | grep -q :{port} && break; sleep 0.05; done"
    client = (f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | openssl s_client -connect "
              f"127.0.0.1:{{port}} -CAfile {w}/ca.pem -verify_return_error -quiet")
    curl = f"curl -sS --cacert {w}/ca.pem -o /dev/null https://localhost:{{port}}/"

    def pair(name: str, port: int, peer: str) -> Program:
        script = f"{srv} & {wait}; {peer}; wait".format(port=port)
        return Program("openssl", name, "openssl", ("sh", "-c", script))

    return [
        Program("openssl", "req -x509 (new RSA key)", "openssl", (*ossl, "req", "-x509",
                "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=corpus", "-days", "2",
                "-keyout", f"{w}/req.key", "-out", f"{w}/req.pem")),
        Program("openssl", "req -new (CSR from a key)", "openssl", (*ossl, "req", "-new",
                "-key", f"{w}/srv.key", "-subj", "/CN=csr", "-out", f"{w}/again.csr")),
        Program("openssl", "x509 -text", "openssl", (*ossl, "x509", "-in", f"{w}/srv.pem",
                "-noout", "-text")),
        Program("openssl", "x509 -req (sign a CSR)", "openssl", (*ossl, "x509", "-req", "-in",
                f"{w}/srv.csr", "-CA", f"{w}/ca.pem", "-CAkey", f"{w}/ca.key",
                "-CAcreateserial", "-days", "2", "-out", f"{w}/signed.pem")),
        Program("openssl", "verify", "openssl", (*ossl, "verify", "-CAfile", f"{w}/ca.pem",
                f"{w}/srv.pem")),
        Program("openssl", "genpkey ec", "openssl", (*ossl, "genpkey", "-algorithm", "EC",
                "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{w}/ec.key")),
        Program("openssl", "pkey -pubout", "openssl", (*ossl, "pkey", "-in", f"{w}/srv.key",
                "-pubout", "-out", f"{w}/srv.pub")),
        Program("openssl", "pkcs12 -export", "openssl", (*ossl, "pkcs12", "-export", "-in",
                f"{w}/srv.pem", "-inkey", f"{w}/srv.key", "-passout", "pass:x", "-out",
                f"{w}/srv.p12")),
        Program("openssl", "dgst -sign", "openssl", (*ossl, "dgst", "-sha256", "-sign",
                f"{w}/srv.key", "-out", f"{w}/sig", f"{w}/srv.pem")),
        pair("s_server + s_client (loopback)", 48411, client.format(port=48411)),
        pair("s_server + curl (loopback)", 48412, curl.format(port=48412)),
    ]


def virsh() -> list[Program]:
    cmds = ["list --all", "dominfo test", "dumpxml test", "nodeinfo", "capabilities",
            "net-list --all", "net-dumpxml default", "pool-list --all", "vol-list default-pool",
            "iface-list --all", "domstate test", "version",
            "destroy test; start test; suspend test; resume test; dominfo test"]
    return [Program("virsh", f"virsh {c}", "libvirt",
                    ("virsh", "-c", "test:///default", *(c.split() if ";" not in c else [c])))
            for c in cmds]


# Real leaks of Debian's gio 2.74: valgrind memcheck (--leak-check=full
# --show-leak-kinds=all) finds GObjects definitely lost at the same allocation site
# as refcntd (benchmarks/results/leak-kinds-valgrind.md; benchmarks/corpus-notes.md).
REAL_LEAKS = {
    "gio list /usr/share": "GLocalFileEnumerator (1 definitely lost) and the GLocalFile it "
                           "holds (indirectly lost), never unreffed by gio list",
    "gio tree /usr/share/glib-2.0": "one GLocalFileEnumerator per directory (8 definitely "
                                    "lost) and the GLocalFiles they hold",
    "gio cat $WORK/in.svg": "the GFileInputStream of g_file_read (1 definitely lost)",
}


def gio_tools(work: Path) -> list[Program]:
    w = str(work)
    runs = [("gio", "info /etc/passwd"), ("gio", "list /usr/share"), ("gio", f"cat {w}/in.svg"),
            ("gio", "mime text/plain"), ("gio", f"copy {w}/in.svg {w}/copy.svg"),
            ("gio", "info -a standard::* /usr/bin"), ("gio", "tree /usr/share/glib-2.0"),
            ("gsettings", "list-schemas"), ("gsettings", "list-recursively org.gnome.desktop.a11y"),
            ("gsettings", "get org.gnome.desktop.interface font-name"),
            ("gdbus", "call --session --dest org.freedesktop.DBus --object-path "
                      "/org/freedesktop/DBus --method org.freedesktop.DBus.ListNames"),
            ("gdbus", "introspect --session --dest org.freedesktop.DBus --object-path "
                      "/org/freedesktop/DBus")]
    return [Program("gio-tools", f"{tool} {args}", "gobject", (tool, *args.split()),
                    truth="leak" if f"{tool} {args}".replace(w, "$WORK") in REAL_LEAKS
                    else "clean") for tool, args in runs]


def gstreamer(work: Path) -> list[Program]:
    pipelines = [
        "fakesrc num-buffers=200 ! fakesink",
        "fakesrc num-buffers=200 ! queue ! identity ! queue ! fakesink",
        "videotestsrc num-buffers=50 ! videoconvert ! fakesink",
        "videotestsrc num-buffers=30 ! queue ! videoconvert ! queue ! videoscale ! "
        "video/x-raw,width=160,height=120 ! fakesink",
        "audiotestsrc num-buffers=50 ! audioconvert ! audioresample ! fakesink",
        "audiotestsrc num-buffers=30 ! tee name=t t. ! queue ! fakesink t. ! queue ! fakesink",
        f"audiotestsrc num-buffers=40 ! audioconvert ! vorbisenc ! oggmux ! filesink "
        f"location={work}/out.ogg",
        f"filesrc location={work}/in.ogg ! oggdemux ! vorbisdec ! audioconvert ! fakesink",
        f"uridecodebin uri=file://{work}/in.ogg ! audioconvert ! fakesink",
        "videotestsrc num-buffers=10 ! theoraenc ! oggmux ! fakesink",
    ]
    return [Program("gstreamer", p, "gstreamer", ("gst-launch-1.0", "-q", *p.split()),
                    truth="gst-leaks") for p in pipelines]


def cairo(work: Path) -> list[Program]:
    w = str(work)
    runs = [("rsvg-convert -f png", ("rsvg-convert", "-f", "png", "-o", f"{w}/o.png")),
            ("rsvg-convert -f pdf", ("rsvg-convert", "-f", "pdf", "-o", f"{w}/o.pdf")),
            ("rsvg-convert -f ps", ("rsvg-convert", "-f", "ps", "-o", f"{w}/o.ps")),
            ("rsvg-convert -f svg", ("rsvg-convert", "-f", "svg", "-o", f"{w}/o.svg"))]
    progs = [Program("cairo", name, "cairo", (*argv, f"{w}/in.svg")) for name, argv in runs]
    for fmt in ("png", "svg", "ps", "pdf"):
        progs.append(Program("cairo", f"pdftocairo -{fmt}", "cairo",
                             ("pdftocairo", f"-{fmt}", f"{w}/in.pdf", f"{w}/pdf-out.{fmt}")))
    return progs


def glib_tests(passing: list[str], env: dict[str, str]) -> list[Program]:
    """GLib's installed tests named in `passing` (they pass without refcntd), each under
    gobject when it links libgobject, else glib; a script whose processes never load
    libglib is "unaudited"."""
    progs = []
    for name in passing:
        argv = tuple(_exec_line(GLIB_TESTS / f"{name}.test").split())
        spec = "gobject" if _links(argv, GOBJECT_LIB) else "glib"
        truth = "clean" if _is_elf(argv[0]) or _maps(argv, env, GLIB_LIB) else "unaudited"
        progs.append(Program("glib-tests", name, spec, argv, truth=truth))
    return progs


def _is_elf(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def _maps(argv: tuple[str, ...], env: dict[str, str], soname: str) -> bool:
    """Whether any process of an untraced run of argv opens soname (strace -f): the
    truth for a script, which ldd cannot answer."""
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as log:
        subprocess.run(["strace", "-f", "-qq", "-e", "trace=open,openat", "-o", log.name,
                        *argv], env={**os.environ, **env}, cwd=env["TMPDIR"],
                       capture_output=True, timeout=GLIB_TIMEOUT_S)
        return any(soname in line and "ENOENT" not in line for line in log)


def glib_test_names() -> list[str]:
    return sorted(p.stem for p in GLIB_TESTS.glob("*.test"))


def glib_test_argv(name: str) -> list[str]:
    return _exec_line(GLIB_TESTS / f"{name}.test").split()


def _exec_line(test_file: Path) -> str:
    for line in test_file.read_text().splitlines():
        if line.startswith("Exec="):
            return line[len("Exec="):]
    raise ValueError(f"{test_file}: no Exec= line")


def _links(argv: tuple[str, ...], soname: str) -> bool:
    exe = next((a for a in argv if a.startswith("/usr/libexec/")), argv[0])
    out = subprocess.run(["ldd", exe], capture_output=True, text=True).stdout
    return soname in out


SVG = ('<svg xmlns="http://www.w3.org/2000/svg" width="200" height="120">'
       '<rect x="10" y="10" width="180" height="100" fill="#3a6" stroke="black"/>'
       '<circle cx="100" cy="60" r="40" fill="url(#g)"/><defs><linearGradient id="g">'
       '<stop offset="0" stop-color="red"/><stop offset="1" stop-color="blue"/>'
       '</linearGradient></defs><text x="20" y="100" font-size="14">corpus</text></svg>')


def fixtures(work: Path, env: dict[str, str]) -> None:
    """Input files for the programs above, made untraced; the last step also builds
    GStreamer's plugin registry in HOME, as any machine that ran GStreamer once has it
    (with none, every gst-launch-1.0 first runs gst-plugin-scanner, whose plugin
    features live until it exits without gst_deinit)."""
    work.mkdir(parents=True, exist_ok=True)
    w = str(work)
    (work / "in.svg").write_text(SVG)
    steps = [
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=corpus CA",
         "-days", "2", "-keyout", f"{w}/ca.key", "-out", f"{w}/ca.pem"],
        ["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", f"{w}/srv.key", "-out", f"{w}/srv.csr"],
        ["openssl", "x509", "-req", "-in", f"{w}/srv.csr", "-CA", f"{w}/ca.pem", "-CAkey",
         f"{w}/ca.key", "-CAcreateserial", "-days", "2", "-copy_extensions", "copy",
         "-out", f"{w}/srv.pem"],
        ["rsvg-convert", "-f", "pdf", "-o", f"{w}/in.pdf", f"{w}/in.svg"],
        ["gst-launch-1.0", "-q", "audiotestsrc", "num-buffers=40", "!", "audioconvert", "!",
         "vorbisenc", "!", "oggmux", "!", "filesink", f"location={w}/in.ogg"],
    ]
    for step in steps:
        subprocess.run(step, check=True, capture_output=True, timeout=120,
                       env={**os.environ, **env})


def session_env(work: Path) -> dict[str, str]:
    """HOME, XDG dirs and TMPDIR inside the work folder (the tests write there)."""
    env = {"HOME": str(work / "home"), "XDG_RUNTIME_DIR": str(work / "run"),
           "TMPDIR": str(work / "tmp"), "GST_DEBUG_NO_COLOR": "1"}
    for key in ("HOME", "XDG_RUNTIME_DIR", "TMPDIR"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    os.chmod(env["XDG_RUNTIME_DIR"], 0o700)
    return env


def missing_tools() -> list[str]:
    tools = ["strace", "openssl", "curl", "virsh", "gio", "gsettings", "gdbus", "gst-launch-1.0",
             "rsvg-convert", "pdftocairo", "dbus-daemon", "ss"]
    missing = [t for t in tools if shutil.which(t) is None]
    return missing + ([] if GLIB_TESTS.is_dir() else [str(GLIB_TESTS)])

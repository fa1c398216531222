"""The fifth codebase: libdbus-1 1.14, -O2, held out whole (issue 41).

Debian's dbus source (`apt-get source dbus`), configured with autotools
(-O2 -g, frame pointers; no systemd, SELinux, AppArmor, X11, docs or tests)
and built out of tree, never installed.  The mutated library is the built
libdbus-1.so.3 with its tools dbus-send, dbus-test-tool and
dbus-update-activation-environment (run from build/tools/.libs with
LD_LIBRARY_PATH on the built library).  Each workload is one tool against a
private bus: the machine's dbus-run-session and dbus-daemon (Debian's own
libdbus, which the spec does not name: the bus is not mutated and its objects
are not counted).

The rules of refcntd's inference are frozen at main 949db32 (refcntd/analysis at
tree f2974e1), as for libxkbcommon (xkb.py): no rule was written or changed after
reading any of this codebase's answers.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import debian
import tracefs
import truth
from codebase import Codebase, Workload, api_probes, debian_configure
from sites import Api

HERE = Path(__file__).resolve().parent
PACKAGES = ["dpkg-dev", "libexpat1-dev", "pkg-config", "dbus-daemon", "dbus-bin"]
CONFIGURE = ["CFLAGS=-O2 -g -fno-omit-frame-pointer", "--prefix=/usr", "--sysconfdir=/etc",
             "--localstatedir=/var", "--disable-static", "--disable-systemd",
             "--disable-selinux", "--disable-apparmor", "--disable-libaudit",
             "--disable-x11-autolaunch", "--disable-doxygen-docs", "--disable-xml-docs",
             "--disable-ducktype-docs", "--without-x", "--disable-modular-tests",
             "--disable-embedded-tests", "--disable-asserts", "--disable-verbose-mode"]
GETS = frozenset({"dbus_message_ref", "dbus_connection_ref", "_dbus_connection_ref_unlocked",
                  "dbus_pending_call_ref", "_dbus_pending_call_ref_unlocked"})
PUTS = frozenset({"dbus_message_unref", "dbus_connection_unref",
                  "_dbus_connection_unref_unlocked", "dbus_pending_call_unref",
                  "_dbus_pending_call_unref_and_unlock"})
TYPE = {n: ("DBusMessage" if "message" in n else "DBusConnection" if "connection" in n
            else "DBusPendingCall") for n in GETS | PUTS}
CONSTRUCTORS = {"DBusMessage": "dbus_message_new_empty_header",
                "DBusConnection": "_dbus_connection_new_for_transport",
                "DBusPendingCall": "_dbus_pending_call_new_unlocked"}
TOOLS = ("dbus-send", "dbus-test-tool", "dbus-update-activation-environment")
SESSION = ("dbus-run-session --config-file=/usr/share/dbus-1/session.conf -- "
           "env LD_LIBRARY_PATH=@LIBS@ ")
DBUS = "--dest=org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus"
# (label, what runs inside the private bus; BIN is build/tools/.libs): method calls
# with replies and with errors, signals, typed arguments, a connection of its own
# by address, the test tool's spam (queued, flooded, no reply, reconnecting) and
# the activation environment update
WORKLOADS = (
    ("send ListNames", f"BIN/dbus-send --session --print-reply {DBUS}.ListNames"),
    ("send GetNameOwner", f"BIN/dbus-send --session --print-reply {DBUS}.GetNameOwner "
     "string:org.freedesktop.DBus"),
    ("send error", "BIN/dbus-send --session --print-reply --dest=org.example.Nobody "
     "/org/example org.example.Nobody.Call int32:1"),
    ("send signal", "BIN/dbus-send --session --type=signal /org/example "
     "org.example.Signal string:hello array:int32:1,2,3 dict:string:int32:a,1,b,2"),
    ("send --address", "sh -c 'exec BIN/dbus-send --address=\"$DBUS_SESSION_BUS_ADDRESS\" "
     f"--print-reply {DBUS}.Hello'"),
    ("spam queue", "BIN/dbus-test-tool spam --count=30 --queue=4 --ignore-errors"),
    ("spam flood", "BIN/dbus-test-tool spam --count=30 --flood --ignore-errors"),
    ("spam no reply", "BIN/dbus-test-tool spam --count=30 --no-reply"),
    ("spam reconnect", "BIN/dbus-test-tool spam --count=12 --messages-per-conn=4 "
     "--ignore-errors"),
    ("update-activation-environment", "BIN/dbus-update-activation-environment --verbose "
     "REFCNTD_MUTANTS=1"),
)


def codebase(out: Path) -> Codebase:
    work = out / "dbus"
    build = work / "build"
    libs = build / "dbus" / ".libs"
    bins = build / "tools" / ".libs"
    api = Api(GETS, PUTS, {}, TYPE)
    targets = {n: ("get" if n in GETS else "put") for n in GETS | PUTS}
    session = SESSION.replace("@LIBS@", str(libs))
    return Codebase(
        "dbus", work, work / "src", build, api, targets, ["dbus/*.c", "tools/*.c"],
        [libs / "libdbus-1.so.3", *(bins / t for t in TOOLS)],
        [Workload(label, ("/bin/sh", "-c", "exec " + session + cmd.replace("BIN", str(bins))))
         for label, cmd in WORKLOADS],
        work / "dbus-built.yaml",
        build_cmd=["sh", "-c", f"make -s -C {build}/dbus libdbus-1.la && "
                   f"make -s -C {build}/tools {' '.join(TOOLS)}"])


def prepare(cb: Codebase) -> None:
    debian.install(PACKAGES)
    steps = debian_configure(cb, "dbus", CONFIGURE)
    if not cb.binaries[0].exists():
        subprocess.run(["make", "-s", "-j2", "-C", str(cb.build_dir)], check=True,
                       capture_output=True)
    steps["rebuild_check_s"] = cb.build()
    steps["build_command"] = f"configure {' '.join(CONFIGURE)} && make"
    steps["packages"] = {p: debian.version(p) for p in ("dbus-daemon",)}
    spec = (HERE / "libdbus" / "dbus.yaml").read_text()
    cb.spec.write_text(spec.replace("library: libdbus-1.so.3", f"library: {cb.binaries[0]}"))
    cb.prepared = steps


def probes(cb: Codebase) -> tuple[list[tracefs.Probe], dict[str, truth.Rule]]:
    """The constructors' returns, and the entries of every ref and unref."""
    return api_probes(cb.binaries[0].resolve(), CONSTRUCTORS, GETS, PUTS, "dbus")

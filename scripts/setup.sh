#!/usr/bin/env bash
# Install everything refcntd needs on Debian 12 or 13, as root.  Idempotent: a
# second run installs nothing new.
#   - Debian's bcc (python3-bpfcc, not on PyPI) and bpftool
#   - kernel headers: the generic linux-headers-amd64; refcntd merges its
#     -common and -amd64 trees itself at run time (see refcntd/kheaders.py)
#   - gcc and systemtap-sdt-dev to build the examples and test fixtures;
#     libglib2.0-dev + pkg-config for the GLib fixture, debuginfod for the
#     test that symbolizes through a debuginfod server
#   - a venv in .venv, made from /usr/bin/python3, that sees Debian's bcc
#     package and nothing else of Debian's Python: every other dependency
#     comes from PyPI at the version pyproject.toml asks for, whatever the
#     machine had installed (tests/unit/test_environment.py checks it)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "setup.sh: run as root (it installs Debian packages)" >&2
    exit 1
fi

PACKAGES=(python3-bpfcc bpfcc-tools bpftool linux-headers-amd64 python3-venv
          gcc libc6-dev make binutils systemtap-sdt-dev systemd curl
          # libraries of the bundled specs (configs/specs), for their tests
          pkg-config libglib2.0-dev libgstreamer1.0-dev libvirt-dev libvirt0 libssl-dev
          libcairo2-dev
          # json-glib, a GObject library of its own: `spec draft` is tested on it
          libjson-glib-1.0-0
          # promtool and a real Prometheus for the rules tests (configs/prometheus)
          prometheus
          # libdw: the DWARF scan for inlined copies and clones (binary/dwarfscan.py);
          # "A|B": Debian 13's name (64-bit time_t), else Debian 12's
          "libdw1t64|libdw1"
          # debuginfod: the separate-debug-file tests serve a directory on loopback
          debuginfod
          # Debian's own -O2 libc with its DWARF: the inlined-copy scan is tested on it
          libc6-dbg
          # Debian's untyped pyelftools 0.29, pulled in on many machines: installed
          # so every run proves the venv does not pick it up (test_environment.py)
          python3-pyelftools
          # libseccomp's Python binding: the unit tests apply the unit's SystemCallFilter=
          python3-seccomp
          # Go's own pprof (`go tool pprof`) reads the pprof profiles the tests write and
          # scrape; headless Chromium opens the --format html report (docs/profiles.md)
          golang-go chromium
          # the corpus of real programs (benchmarks/corpus.py, tests/bpf/test_corpus_smoke.py):
          # GLib's installed tests, gst-launch-1.0 with the base plugins, virsh, and two
          # cairo users (rsvg-convert, pdftocairo); gio/gsettings/gdbus, openssl and curl are
          # already here; dbus-daemon comes with them
          libglib2.0-tests gstreamer1.0-tools gstreamer1.0-plugins-base libvirt-clients
          librsvg2-bin poppler-utils
          # strace: whether a test script's processes load libglib at all (its truth)
          strace
          # the oracles of the tests: valgrind's leak kinds (test_leak_kinds, test_reach_scan,
          # test_gslice_kinds), gdb's stack (test_unwind_openssl); ss (iproute2) for the
          # corpus's sockets.  A minbase userland (benchmarks/distros.py) has none of them
          valgrind gdb iproute2)
# Every installed package of the list, asked of dpkg once (not a dpkg-query and a grep per
# package: 90 processes, 20 s of a busy machine's wall time).
declare -A INSTALLED=()
while read -r pkg status; do
    [ "$status" = "install ok installed" ] && INSTALLED[$pkg]=1
done < <(dpkg-query -W -f='${Package} ${Status}\n' ${PACKAGES[*]//|/ } 2>/dev/null || true)
installed() {
    [ -n "${INSTALLED[$1]:-}" ]
}
# The first of "A|B" this release's archive has (after apt-get update).
candidate() {
    local alt
    for alt in ${1//|/ }; do
        if apt-cache policy "$alt" 2>/dev/null | grep -q "Candidate: [^(]"; then
            echo "$alt"; return
        fi
    done
    echo "${1%%|*}"
}
missing=()
for entry in "${PACKAGES[@]}"; do
    found=0
    for pkg in ${entry//|/ }; do
        if installed "$pkg"; then found=1; break; fi
    done
    [ "$found" = 1 ] || missing+=("$entry")
done
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    wanted=()
    for entry in "${missing[@]}"; do wanted+=("$(candidate "$entry")"); done
    echo "setup.sh: installing ${wanted[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${wanted[@]}" >/dev/null
fi

# A venv made with --system-site-packages (as setup.sh once did) let Debian's
# python3-* packages satisfy pip's requirements: start it again without them.
if grep -qs "include-system-site-packages = true" .venv/pyvenv.cfg; then
    rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
    /usr/bin/python3 -m venv .venv
fi
# bcc (Debian's python3-bpfcc, not on PyPI, standard library only) is the one
# package taken from Debian's site: linked in by itself.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
ln -sfn /usr/lib/python3/dist-packages/bcc "$site/bcc"
# pip only when pyproject.toml changed since the last install that left the venv current
# (scripts/venv_current.py: every requirement met, refcntd editable from here): its resolve
# alone is 7 s of CPU, a minute of a busy machine's wall time, at every test.sh.
stamp=.venv/.pyproject.sha256
if [ "$(cat "$stamp" 2>/dev/null)" != "$(sha256sum < pyproject.toml)" ] \
        || ! .venv/bin/python scripts/venv_current.py; then
    rm -f "$stamp"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' 2>&1 \
        | grep -v "^WARNING: Location" || true
    if .venv/bin/python scripts/venv_current.py; then sha256sum < pyproject.toml > "$stamp"; fi
fi

# refcntd's own bytecode, written now: the first run would otherwise compile every
# module it imports (about 0.3 s of a start), and every run would where
# PYTHONDONTWRITEBYTECODE is set.  Up-to-date files are skipped.
.venv/bin/python -m compileall -q refcntd

# The compiled chunk walker (refcntd/reach/chunkwalk.c, loaded with ctypes): the live
# scan follows glibc's chunk chain with it while the process is stopped (a few ns a
# chunk; without it numpy, about 0.5 us, and the scan says so in a note).  Built to a
# temporary name and moved: a running refcntd that mapped the old one keeps it intact.
walker=refcntd/reach/_chunkwalk.so
if [ ! -e "$walker" ] || [ refcntd/reach/chunkwalk.c -nt "$walker" ]; then
    gcc -O2 -shared -fPIC -Wall -Wextra -Werror -o "$walker.tmp" refcntd/reach/chunkwalk.c
    mv -f "$walker.tmp" "$walker"
fi

if ! [ -d /sys/kernel/tracing/events ] && ! [ -d /sys/kernel/debug/tracing/events ]; then
    mount -t tracefs nodev /sys/kernel/tracing
fi
# Compile the BPF programs for this kernel now (about 30 s once; a second after):
# attach, run and serve then start without waiting for clang.
if [ "$(id -u)" = 0 ]; then
    .venv/bin/refcntd prebuild --quiet \
        || echo "setup.sh: refcntd prebuild failed (above); each start will compile instead"
fi
echo "setup.sh: ready (.venv/bin/refcntd)"

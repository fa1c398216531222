"""Debian packages and sources for the mutation benchmark, through apt only.

The machine's own suites (bookworm, bookworm-updates, bookworm-security) are
the only ones used: `apt-get source` needs deb-src entries for them, written
here into one file of /etc/apt/sources.list.d (and nowhere else), copied from
the machine's deb entries for those suites.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SOURCES = Path("/etc/apt/sources.list.d")
SRC_FILE = SOURCES / "refcntd-mutants-src.sources"
SUITES = ("bookworm", "bookworm-updates", "bookworm-security")
ENV = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}


def installed(package: str) -> bool:
    out = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package],
                         capture_output=True, text=True)
    return out.returncode == 0 and "install ok installed" in out.stdout


def install(packages: list[str]) -> list[str]:
    """apt-get install what is missing; returns what was installed."""
    missing = [p for p in packages if not installed(p)]
    if missing:
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=ENV,
                       stdout=subprocess.DEVNULL)
    return missing


def _stanzas(text: str) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for block in text.split("\n\n"):
        fields = dict(line.split(":", 1) for line in block.splitlines()
                      if ":" in line and not line.startswith("#"))
        if fields:
            out.append({k.strip(): v.strip() for k, v in fields.items()})
    return out


def deb_src_entries() -> str:
    """deb-src stanzas for the machine's deb entries of SUITES (deb822 format)."""
    text = ""
    for path in sorted(SOURCES.glob("*.sources")):
        if path == SRC_FILE:
            continue
        for st in _stanzas(path.read_text()):
            suites = [s for s in st.get("Suites", "").split() if s in SUITES]
            if "deb" not in st.get("Types", "").split() or not suites:
                continue
            text += (f"Types: deb-src\nURIs: {st['URIs']}\nSuites: {' '.join(suites)}\n"
                     f"Components: {st.get('Components', 'main')}\n")
            if "Signed-By" in st:
                text += f"Signed-By: {st['Signed-By']}\n"
            text += "\n"
    return text


def ensure_deb_src() -> None:
    """Write SRC_FILE (written by this script only) and refresh the lists when it changed."""
    text = ("# Written by refcntd's benchmarks/mutants (apt-get source for the mutation\n"
            "# benchmark): deb-src for the suites this machine already uses.\n\n"
            + deb_src_entries())
    if "deb-src" not in text:
        raise SystemExit("no deb entry for bookworm suites in /etc/apt/sources.list.d")
    if SRC_FILE.exists() and SRC_FILE.read_text() == text:
        return
    SRC_FILE.write_text(text)
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=ENV)


def source(package: str, dest: Path) -> Path:
    """`apt-get source` PACKAGE into DEST (once); returns the unpacked tree."""
    dest.mkdir(parents=True, exist_ok=True)
    trees = sorted(d for d in dest.glob(f"{package}-*") if d.is_dir())
    if not trees:
        ensure_deb_src()
        subprocess.run(["apt-get", "source", "-qq", package], cwd=dest, check=True, env=ENV,
                       stdout=subprocess.DEVNULL)
        trees = sorted(d for d in dest.glob(f"{package}-*") if d.is_dir())
    return trees[-1]


def version(package: str, source_package: bool = False) -> str:
    if source_package:
        out = subprocess.run(["apt-cache", "showsrc", "--only-source", package],
                             capture_output=True, text=True).stdout
        return next((line.split()[1] for line in out.splitlines()
                     if line.startswith("Version:")), "?")
    return subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                          capture_output=True, text=True).stdout

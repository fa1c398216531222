"""pprof and HTML of real traced programs, read by the real clients: Go's own
`go tool pprof` (the saved file and the live URL of serve and attach --listen) and
headless Chromium (the saved page and the served one)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from conftest import FIXTURES, refcntd
from test_attach import Attached
from test_checkpoint import Requests
from test_run import ALLOCATOR, PERFLIKE_LEAKS
from test_serve import Serve, free_port, target_yaml

from refcntd.binary.elf import read_build_id

CHROMIUM = ["/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--hide-scrollbars",
            "--window-size=1280,1000",
            # Debian's Chromium 156 here dies with SIGTRAP ('close symbol missing', after
            # 'Cannot find getaddrinfo with dlsym') on most http:// loads with its async
            # DNS client; without it, and without proxy lookup, rarely (see chromium())
            "--no-proxy-server", "--disable-features=AsyncDns"]
CRASH_TRIES = 3
LABEL = re.compile(r"(\w+):\[(.*?)\]")


def go_pprof(args: list[str], source: str, tmp: Path) -> str:
    """`go tool pprof ARGS SOURCE`; a fetched profile is saved under tmp, not ~/pprof."""
    out = subprocess.run(["go", "tool", "pprof", *args, source], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PPROF_TMPDIR": str(tmp)})
    assert out.returncode == 0, out.stderr
    return out.stdout


def raw_samples(text: str) -> list[tuple[list[int], dict[str, str]]]:
    """The samples of `go tool pprof -raw`: (values, labels) each."""
    body = text.split("\nSamples:\n", 1)[1].split("\nLocations\n", 1)[0].splitlines()
    assert body[0].split() == ["objects/count[dflt]", "references/count", "age/nanoseconds"]
    out: list[tuple[list[int], dict[str, str]]] = []
    for line in body[1:]:
        if ":" in line and not LABEL.search(line):
            out.append(([int(v) for v in line.split(":")[0].split()], {}))
        else:
            out[-1][1].update(LABEL.findall(line))
    return out


def flat(text: str) -> dict[str, int]:
    """Function -> flat value in `go tool pprof -top`, those with a flat value."""
    rows = re.findall(r"^\s*(\d+)\s+[\d.]+%\s+[\d.]+%\s+\d+\s+[\d.]+%\s+(\S+)", text, re.M)
    return {name: int(v) for v, name in rows if int(v)}


def totals(samples: list[tuple[list[int], dict[str, str]]], key: str = "type"
           ) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for values, labels in samples:
        out[labels[key]] = [a + b for a, b in zip(out.get(labels[key], [0, 0, 0]), values,
                                                   strict=True)]
    return out


def chromium(source: str, tmp: Path, screenshot: Path | None = None) -> str:
    """The page's DOM after its script ran, with a fresh profile; fails on any console
    message (script errors, blocked fetches, CSP violations all log one)."""
    what = [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    for _ in range(CRASH_TRIES):  # a crash by a signal is the browser's, not the page's
        profile = tmp / f"chromium-{time.monotonic_ns()}"
        out = subprocess.run([*CHROMIUM, f"--user-data-dir={profile}",
                              "--enable-logging=stderr", "--v=1", *what, source],
                             capture_output=True, text=True, timeout=120)
        if out.returncode >= 0:
            break
    assert out.returncode == 0, out.stderr[-3000:]
    console = [line for line in out.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console
    return out.stdout


def assert_rendered(dom: str, frames: list[str]) -> None:
    html_tag = re.search(r"<html[^>]*>", dom).group()
    assert "data-rendered=" in html_tag and "data-js-errors" not in html_tag, html_tag
    assert re.search(r'<pre id="js-errors" hidden="">\s*</pre>', dom), dom[:2000]
    flame = dom.split('<div id="flame"', 1)[1].split("<h2>", 1)[0]
    for text in frames:
        assert f">{text}</div>" in flame, (text, flame[:3000])


def test_pprof_file_of_a_real_run_read_by_go_pprof(bpf, build, tmp_path):
    exe = build.perflike("O2fp")
    saved, prof, page = tmp_path / "run.json", tmp_path / "run.pb.gz", tmp_path / "run.html"
    run = refcntd(["run", "--pprof", str(prof), "--html", str(page), "--", str(exe)],
                  json_path=saved)
    assert run.returncode == 23, run.stderr  # the exit status is unchanged
    again = tmp_path / "again.pb.gz"
    rendered = refcntd(["report", "--format", "pprof", "--output", str(again), str(saved)])
    assert rendered.returncode == 23 and rendered.stdout == "", rendered.stderr
    assert again.read_bytes() == prof.read_bytes()  # a view of the same run JSON
    # run --html (issue 41: it did not exist while --pprof did): the report's page
    html = refcntd(["report", "--format", "html", str(saved)])
    assert html.returncode == 23 and page.read_text() == html.stdout
    leaked = run.report["processes"][0]
    references = sum(i["count"] for g in leaked["groups"] for i in g["instances"])

    raw = go_pprof(["-raw"], str(prof), tmp_path)
    samples = raw_samples(raw)
    assert sum(v[0] for v, _ in samples) == run.report["leaked_objects"] == 8
    assert sum(v[1] for v, _ in samples) == references == 18
    assert sum(v[2] for v, _ in samples) > 0  # ages under a millisecond are not 0 (issue 41)
    by_type = totals(samples)
    assert {t: v[0] for t, v in by_type.items()} == {t: len(c) for t, c in
                                                     PERFLIKE_LEAKS.items()}
    assert {t: v[1] for t, v in by_type.items()} == {t: sum(c) for t, c in
                                                     PERFLIKE_LEAKS.items()}
    assert all(labels["process"] == "perflike" and labels["state"] == "exited"
               for _, labels in samples)
    mapping = next(line for line in raw.split("\nMappings\n")[1].splitlines()
                   if str(exe) in line)
    assert read_build_id(exe) in mapping and "[FN][FL][LN]" in mapping, mapping
    assert re.search(r"map__new .*perflike\.c:\d+", raw), raw  # functions, files, lines

    top = go_pprof(["-top", "-sample_index=objects"], str(prof), tmp_path)
    assert flat(top) == {ALLOCATOR[t]: len(c) for t, c in PERFLIKE_LEAKS.items()}, top
    refs = go_pprof(["-top", "-sample_index=references"], str(prof), tmp_path)
    assert "accounting for 18, 100% of 18 total" in refs, refs
    assert flat(refs)["map__new"] == 13


def test_html_of_a_real_run_in_chromium(bpf, build, tmp_path):
    exe = build.perflike("O2fp")
    saved, page = tmp_path / "run.json", tmp_path / "report.html"
    run = refcntd(["run", "--history", "--", str(exe)], json_path=saved)
    assert run.returncode == 23, run.stderr
    out = refcntd(["report", "--format", "html", "--output", str(page), str(saved)])
    assert out.returncode == 23, out.stderr
    text = page.read_text()
    assert "Likely culprit" in text and "history of 0x" in text
    dom = chromium(page.as_uri(), tmp_path)
    assert_rendered(dom, [f"[{t}]" for t in PERFLIKE_LEAKS] + list(ALLOCATOR.values()))
    assert "8 objects in view (all)" in dom
    shot = tmp_path / "report.png"
    chromium(page.as_uri(), tmp_path, shot)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_live_profile_and_page_on_serve(bpf, build, tmp_path):
    exe = build.program("requests", [FIXTURES / "requests.c"])
    with Serve(tmp_path, target_yaml("svc", exe)) as serve:
        url = f"http://127.0.0.1:{serve.port}"
        app = Requests(exe)
        try:
            app.handle(5)
            time.sleep(0.2)
            raw = go_pprof(["-raw"], f"{url}/debug/pprof/refcount", tmp_path)
            top = go_pprof(["-top"], f"{url}/debug/pprof/refcount?target=svc&type=conn",
                           tmp_path)
            with urllib.request.urlopen(f"{url}/debug/pprof/refcount", timeout=60) as r:
                ctype, body = r.headers["Content-Type"], r.read()
            with urllib.request.urlopen(f"{url}/live", timeout=60) as r:
                live = json.loads(r.read())
            none = go_pprof(["-raw"], f"{url}/debug/pprof/refcount?type=session", tmp_path)
            refused = [_status(f"{url}/debug/pprof/refcount?{q}") for q in
                       ("target=nope", "typo=conn")]
            dom = chromium(f"{url}/report.html", tmp_path)
        finally:
            app.kill()
        assert serve.stop() == 0
    assert ctype == "application/octet-stream" and body[:2] == b"\x1f\x8b"
    live_objects = sum(g["objects"] for p in live["targets"]["svc"] for g in p["groups"])
    samples = raw_samples(raw)
    assert totals(samples) == {"conn": [5, 5, totals(samples)["conn"][2]]}
    assert sum(v[0] for v, _ in samples) == live_objects == 5
    assert {labels["target"] for _, labels in samples} == {"svc"}
    assert "Time: " in raw and "state" not in raw  # a snapshot of now
    assert flat(top) == {"obj_new": 5}, top
    assert raw_samples(none) == []
    assert refused == [400, 400]
    assert_rendered(dom, ["[conn]", "obj_new", "handle_request"])
    assert "5 live objects" in dom


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return err.code


def test_live_profile_on_attach_listen(bpf, build, tmp_path):
    exe = build.program("requests", [FIXTURES / "requests.c"])
    port = free_port()
    with Attached(["--binary", str(exe), "--listen", f"127.0.0.1:{port}"],
                  tmp_path / "attach.json") as attached:
        app = Requests(exe)
        try:
            app.handle(3)
            time.sleep(0.2)
            raw = go_pprof(["-raw"], f"http://127.0.0.1:{port}/debug/pprof/refcount",
                           tmp_path)
        finally:
            app.kill()
        code, _, _ = attached.stop()
    assert code == 0
    samples = raw_samples(raw)
    assert totals(samples, "target") == {"requests": [3, 3, totals(samples)["conn"][2]]}

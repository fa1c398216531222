"""Download debug files from debuginfod servers (DEBUGINFOD_URLS), cached on disk.

Symbolization runs when a traced process has exited, on the report worker,
so a slow or dead server must not hold it up: downloads run on a pool of
WORKERS threads (at most BACKLOG build-ids waiting; past that a module goes
without) and a report waits for one at most REFCNTD_DEBUGINFOD_TIMEOUT
seconds (default 5).  A download still running then goes on in the
background, so later reports get the symbols; it is abandoned when the
server sends nothing for max(timeout, 10) s, and a server that stalled once
is not asked again in this session.  Files land in
CACHE_DIR/debuginfod/<build-id>/debuginfo, so a module is fetched once per
machine.

Bounded like elfutils' client (debuginfod-client-config(7)), as refcntd
downloads as root:

* DEBUGINFOD_MAXTIME: seconds for a whole download (0 or unset: 120 s).
* DEBUGINFOD_MAXSIZE: bytes (0 or unset: ELF_LIMIT, since a debug file is
  read into memory); a larger file is refused from its Content-Length or
  X-Debuginfod-Size, or as soon as more arrives.
* Only https, or http to this machine (127.0.0.0/8, ::1, localhost): other
  URLs in DEBUGINFOD_URLS are ignored with a note, and a redirect may
  neither leave that set nor go from https to http.  file:, ftp: and data:
  are never opened.
* The cache is cleaned as elfutils cleans its own: the control files
  `cache_clean_interval_s` (default 86400) and `max_unused_age_s` (default
  604800) in the cache directory hold seconds and are made with the
  defaults when missing; at most once per interval (the mtime of
  cache_clean_interval_s is the last round), before a query, every download
  not used for max_unused_age_s is removed, then its empty directory.  0
  means "immediately" for both.  "Used" is the file's atime, which refcntd
  sets at each use (relatime and noatime mounts would not).
* The cache directory must pass trusted_dir (only root can change it);
  otherwise nothing is downloaded, with a note.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import queue
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from http.client import HTTPMessage, HTTPResponse
from pathlib import Path
from typing import IO

from refcntd import paths
from refcntd.binary.elf import read_build_id
from refcntd.inputs.safefs import (
    ELF_LIMIT,
    UntrustedFileError,
    atomic_write,
    open_untrusted,
    trusted_dir,
)
from refcntd.symbolize.turn import SYMBOLIZE

DEFAULT_TIMEOUT_S = 5.0
MIN_STALL_S = 10.0
TOTAL_S = 120.0
CHUNK = 1 << 16
WORKERS = 2
BACKLOG = 256
IDLE_S = 30.0
CLEAN_INTERVAL_S = 86400  # elfutils' defaults
MAX_UNUSED_AGE_S = 604800
MAX_NOTES = 32
_BUILD_ID = re.compile(r"^[0-9a-f]{8,64}$")
HTTPS_ONLY = "only https, or http to this machine, is used"


class Pending(Exception):
    """The download has not finished within its deadline; ask again later."""


class Refused(Exception):
    """The server's answer broke a bound (size, time, redirect): not retried."""


class DebuginfodClient:
    def __init__(self, urls: list[str], cache_dir: Path, wait_s: float = DEFAULT_TIMEOUT_S,
                 stall_s: float = MIN_STALL_S, total_s: float = TOTAL_S,
                 max_size: int = ELF_LIMIT, workers: int = WORKERS,
                 backlog: int = BACKLOG) -> None:
        self.notes: list[str] = []  # refusals, once each, for the run's notes
        self.urls = [u.rstrip("/") for u in urls if self._allowed(u)]
        self.cache_dir = cache_dir
        self.wait_s, self.stall_s, self.total_s = wait_s, stall_s, total_s
        self.max_size, self.backlog = max_size, backlog
        self.slow: set[str] = set()  # servers that stalled: skipped from then on
        self._jobs: dict[str, tuple[float, Future[str | None]]] = {}
        self._pool = Pool(workers, backlog)
        self._opener = _opener()
        self._cache_problem: str | None = None
        self._cache_checked = False

    @classmethod
    def from_env(cls) -> DebuginfodClient | None:
        urls = os.environ.get("DEBUGINFOD_URLS", "").split()
        if not urls:
            return None
        timeout = max(0.1, _env_number("REFCNTD_DEBUGINFOD_TIMEOUT", DEFAULT_TIMEOUT_S))
        total = _env_number("DEBUGINFOD_MAXTIME", 0) or TOTAL_S
        max_size = int(_env_number("DEBUGINFOD_MAXSIZE", 0)) or ELF_LIMIT
        return cls(urls, paths.CACHE_DIR / "debuginfod", timeout, max(timeout, MIN_STALL_S),
                   total, max_size)

    def cached(self, build_id: str) -> str | None:
        """The downloaded file, marked used now (its atime) for the cache cleaning."""
        path = self.cache_dir / build_id / "debuginfo"
        try:
            st = os.stat(path, follow_symlinks=False)
            os.utime(path, ns=(time.time_ns(), st.st_mtime_ns), follow_symlinks=False)
        except OSError:
            return None
        return str(path)

    def debuginfo(self, build_id: str) -> str | None:
        """Path of the debug file, None if no server has it; raises Pending when late."""
        if not _BUILD_ID.match(build_id) or not self._cache_ready():
            return None
        hit = self.cached(build_id)
        if hit:
            return hit
        if build_id not in self._jobs:
            clean_cache(self.cache_dir)
            now = time.monotonic()
            future = self._pool.submit(lambda: self._download(build_id, now + self.total_s))
            if future is None:
                self._note(f"debuginfod: {self.backlog} downloads already waiting; "
                           f"{build_id} not asked")
                return None
            self._jobs[build_id] = (now + self.wait_s, future)
        deadline, future = self._jobs[build_id]
        try:
            with SYMBOLIZE.aside():  # other targets' reports go on meanwhile
                return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            raise Pending(build_id) from None

    def running(self, build_id: str) -> bool:
        job = self._jobs.get(build_id)
        return job is not None and not job[1].done()

    def _allowed(self, url: str) -> bool:
        problem = url_problem(url)
        if problem:
            self._note(f"debuginfod URL {url} ignored: {problem}")
        return problem is None

    def _cache_ready(self) -> bool:
        """The cache directory exists and only root can change it (checked once)."""
        if not self._cache_checked:
            self._cache_checked = True
            try:
                self.cache_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
            except OSError as err:
                self._cache_problem = f"cannot create it ({err.strerror})"
            self._cache_problem = self._cache_problem or trusted_dir(self.cache_dir)
            if self._cache_problem:
                self._note(f"debuginfod not used: cache {self.cache_dir}: "
                           f"{self._cache_problem}")
        return self._cache_problem is None

    def _download(self, build_id: str, deadline: float) -> str | None:
        for url in self.urls:
            if url in self.slow:
                continue
            where = f"{url}/buildid/{build_id}/debuginfo"
            try:
                data = fetch(self._opener, where, self.stall_s, deadline, self.max_size)
            except TimeoutError:
                self.slow.add(url)
                continue
            except Refused as err:
                self._note(f"debuginfod {where}: {err}")
                continue
            if data is not None:
                return self._store(build_id, data)
        return None

    def _store(self, build_id: str, data: bytes) -> str | None:
        target = self.cache_dir / build_id / "debuginfo"
        try:
            target.parent.mkdir(mode=0o755, exist_ok=True)
            atomic_write(target, data, 0o644)
            if read_build_id(target) != build_id:  # a server that answers with another file
                target.unlink()
                return None
        except OSError:
            return None
        return str(target)

    def _note(self, text: str) -> None:
        if text not in self.notes and len(self.notes) < MAX_NOTES:
            self.notes.append(text)


def url_problem(url: str) -> str | None:
    """None for https, and for http to this machine; else why the URL is not used."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
    except ValueError:
        return HTTPS_ONLY
    if parts.scheme == "https" and host:
        return None
    if parts.scheme == "http" and host and _loopback(host):
        return None
    return HTTPS_ONLY


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to a URL DEBUGINFOD_URLS could hold, never https -> http."""

    def http_error_302(self, req: urllib.request.Request, fp: IO[bytes], code: int,
                       msg: str, headers: HTTPMessage) -> IO[bytes] | None:
        location = headers.get("location") or headers.get("uri") or ""
        newurl = urllib.parse.urljoin(req.full_url, location)
        problem = url_problem(newurl)
        if problem is None and req.full_url.startswith("https:") and \
                not newurl.startswith("https:"):
            problem = "from https to http"
        if problem:
            raise Refused(f"redirect to {newurl} refused ({problem})")
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _opener() -> urllib.request.OpenerDirector:
    """http and https only: no file:, ftp: or data: handler, whatever a redirect says."""
    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.ProxyHandler(), urllib.request.HTTPHandler(),
                    urllib.request.HTTPSHandler(), _Redirects(),
                    urllib.request.HTTPDefaultErrorHandler(),
                    urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    return opener


def fetch(opener: urllib.request.OpenerDirector, url: str, stall_s: float, deadline: float,
          max_size: int) -> bytes | None:
    """The body, or None for a miss or an error.  TimeoutError when the server sends
    nothing for `stall_s` or the download is not done by `deadline` (each read returns
    what one receive brings, so a trickle cannot stretch it); Refused past `max_size`."""
    try:
        with opener.open(url, timeout=stall_s) as resp:
            for header in ("Content-Length", "X-Debuginfod-Size"):
                announced = resp.headers.get(header, "")
                if announced.isdigit() and int(announced) > max_size:
                    raise Refused(f"{announced} bytes, over the size limit ({max_size})")
            return _body(resp, deadline, max_size)
    except (TimeoutError, Refused):
        raise
    except urllib.error.URLError as err:
        if isinstance(err.reason, TimeoutError):
            raise TimeoutError(url) from None
        return None
    except (OSError, ValueError):
        return None


def _body(resp: HTTPResponse, deadline: float, max_size: int) -> bytes:
    chunks, size = [], 0
    while chunk := resp.read1(CHUNK):
        size += len(chunk)
        if size > max_size:
            raise Refused(f"more than {max_size} bytes, over the size limit")
        chunks.append(chunk)
        if time.monotonic() > deadline:
            raise Refused("not complete within the time limit (DEBUGINFOD_MAXTIME)")
    return b"".join(chunks)


class Pool:
    """`workers` daemon threads (started when first needed) and at most `backlog` jobs
    waiting: a burst of new modules neither starts a thread each nor queues without end.
    Daemon threads: a download never keeps refcntd from exiting."""

    def __init__(self, workers: int, backlog: int) -> None:
        self._queue: queue.Queue[tuple[Future[str | None], Callable[[], str | None]]] = \
            queue.Queue(backlog)
        self._workers = workers
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], str | None]) -> Future[str | None] | None:
        """The job's future, None when `backlog` jobs are already waiting."""
        future: Future[str | None] = Future()
        try:
            self._queue.put_nowait((future, job))
        except queue.Full:
            return None
        with self._lock:
            while len(self._threads) < self._workers:
                thread = threading.Thread(target=self._work, name="debuginfod", daemon=True)
                thread.start()
                self._threads.append(thread)
        return future

    @property
    def threads(self) -> int:
        return len(self._threads)

    def _work(self) -> None:
        """Runs jobs; ends after IDLE_S without one (a finder of a finished run leaves no
        thread behind)."""
        while True:
            try:
                future, job = self._queue.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._threads.remove(threading.current_thread())
                        return
                continue
            try:
                future.set_result(job())
            except Exception as err:  # noqa: BLE001 - handed to the waiting report
                future.set_exception(err)


def clean_cache(cache_dir: Path, now: float | None = None) -> int:
    """One cleaning round if one is due (elfutils' semantics, above): files removed."""
    now = time.time() if now is None else now
    interval = _control(cache_dir, "cache_clean_interval_s", CLEAN_INTERVAL_S)
    max_age = _control(cache_dir, "max_unused_age_s", MAX_UNUSED_AGE_S)
    stamp = cache_dir / "cache_clean_interval_s"
    try:
        if now - os.stat(stamp).st_mtime < interval:
            return 0
        os.utime(stamp, (now, now))
        entries = list(os.scandir(cache_dir))
    except OSError:
        return 0
    return sum(_clean_entry(Path(e.path), now, max_age) for e in entries
               if _BUILD_ID.match(e.name) and e.is_dir(follow_symlinks=False))


def _clean_entry(directory: Path, now: float, max_age: float) -> int:
    removed = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            st = entry.stat(follow_symlinks=False)
            if now - max(st.st_atime, st.st_mtime) >= max_age:
                os.unlink(entry.path)
                removed += 1
        os.rmdir(directory)  # fails while it holds a file still in use
    return removed


def _control(cache_dir: Path, name: str, default: int) -> int:
    """A control file's number of seconds; made with the default when missing."""
    path = cache_dir / name
    try:
        with open_untrusted(path, 64, what="debuginfod control file",
                            owners={0, os.geteuid()}) as f:
            return int(f.read_all().decode().strip())
    except UntrustedFileError as err:
        if err.missing:
            with contextlib.suppress(OSError):
                atomic_write(path, f"{default}\n".encode(), 0o644)
        return default
    except ValueError:
        return default


def _env_number(name: str, default: float) -> float:
    try:
        return max(0.0, float(os.environ.get(name, default)))
    except ValueError:
        return default

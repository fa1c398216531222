"""Download debug files from debuginfod servers (DEBUGINFOD_URLS), cached on disk.

Symbolization runs when a traced process has exited, on the thread that
reads the kernel's events, so a slow or dead server must not hold it up:
downloads run on worker threads and a report waits for one at most
REFCNTD_DEBUGINFOD_TIMEOUT seconds (default 5).  A download still running
then goes on in the background (a large debug file on a slow link), so
later reports get the symbols; it is abandoned when the server sends
nothing for max(timeout, 10) s or after 120 s in all, and a server that
stalled once is not asked again in this session.  Files land in
CACHE_DIR/debuginfod/<build-id>/debuginfo, so a module is fetched once per
machine.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from refcntd import paths
from refcntd.binary.elf import read_build_id

DEFAULT_TIMEOUT_S = 5.0
MIN_STALL_S = 10.0
TOTAL_S = 120.0
CHUNK = 1 << 16
_BUILD_ID = re.compile(r"^[0-9a-f]{8,64}$")


class Pending(Exception):
    """The download has not finished within its deadline; ask again later."""


class DebuginfodClient:
    def __init__(self, urls: list[str], cache_dir: Path, wait_s: float = DEFAULT_TIMEOUT_S,
                 stall_s: float = MIN_STALL_S, total_s: float = TOTAL_S) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.cache_dir = cache_dir
        self.wait_s, self.stall_s, self.total_s = wait_s, stall_s, total_s
        self.slow: set[str] = set()  # servers that stalled: skipped from then on
        self._jobs: dict[str, tuple[float, Future[str | None]]] = {}
        self._slots = threading.Semaphore(2)  # downloads at a time

    @classmethod
    def from_env(cls) -> DebuginfodClient | None:
        urls = os.environ.get("DEBUGINFOD_URLS", "").split()
        if not urls:
            return None
        try:
            timeout = float(os.environ.get("REFCNTD_DEBUGINFOD_TIMEOUT", DEFAULT_TIMEOUT_S))
        except ValueError:
            timeout = DEFAULT_TIMEOUT_S
        timeout = max(0.1, timeout)
        return cls(urls, paths.CACHE_DIR / "debuginfod", timeout, max(timeout, MIN_STALL_S))

    def cached(self, build_id: str) -> str | None:
        path = self.cache_dir / build_id / "debuginfo"
        return str(path) if path.is_file() else None

    def debuginfo(self, build_id: str) -> str | None:
        """Path of the debug file, None if no server has it; raises Pending when late."""
        if not _BUILD_ID.match(build_id):
            return None
        hit = self.cached(build_id)
        if hit:
            return hit
        if build_id not in self._jobs:
            now = time.monotonic()
            future: Future[str | None] = Future()
            threading.Thread(target=self._run, args=(future, build_id, now + self.total_s),
                             name="debuginfod", daemon=True).start()
            self._jobs[build_id] = (now + self.wait_s, future)
        deadline, future = self._jobs[build_id]
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            raise Pending(build_id) from None

    def running(self, build_id: str) -> bool:
        job = self._jobs.get(build_id)
        return job is not None and not job[1].done()

    def _run(self, future: Future[str | None], build_id: str, deadline: float) -> None:
        """Daemon threads: a download never keeps refcntd from exiting."""
        with self._slots:
            try:
                future.set_result(self._download(build_id, deadline))
            except Exception as err:  # noqa: BLE001 - handed to the waiting report
                future.set_exception(err)

    def _download(self, build_id: str, deadline: float) -> str | None:
        for url in self.urls:
            if url in self.slow:
                continue
            try:
                data = _fetch(f"{url}/buildid/{build_id}/debuginfo", self.stall_s, deadline)
            except TimeoutError:
                self.slow.add(url)
                continue
            if data is not None:
                return self._store(build_id, data)
        return None

    def _store(self, build_id: str, data: bytes) -> str | None:
        target = self.cache_dir / build_id / "debuginfo"
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".part-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if read_build_id(tmp) != build_id:  # a server that answers with another file
                os.unlink(tmp)
                return None
            os.replace(tmp, target)
        except OSError:
            return None
        return str(target)


def _fetch(url: str, stall_s: float, deadline: float) -> bytes | None:
    """The body, or None for a miss or an error; TimeoutError when the server
    sends nothing for `stall_s` or the download is not done by `deadline`."""
    try:
        with urllib.request.urlopen(url, timeout=stall_s) as resp:  # noqa: S310 - user's URL
            chunks = []
            while chunk := resp.read(CHUNK):
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise TimeoutError(url)
            return b"".join(chunks)
    except TimeoutError:
        raise
    except urllib.error.URLError as err:
        if isinstance(err.reason, TimeoutError):
            raise TimeoutError(url) from None
        return None
    except (OSError, ValueError):
        return None

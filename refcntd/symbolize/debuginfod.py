"""Download debug files from debuginfod servers (DEBUGINFOD_URLS), cached on disk.

Symbolization runs when a traced process has exited, on the thread that
reads the kernel's events, so a slow or dead server must not hold it up:
downloads run on worker threads, a report waits for one at most until that
download's deadline (REFCNTD_DEBUGINFOD_TIMEOUT seconds after it started,
default 5), and a download still running then goes on in the background so
that later reports get the symbols.  A server that timed out once is not
asked again in this session.  Files land in CACHE_DIR/debuginfod/<build-id>/
so a module is fetched once per machine.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from refcntd import paths
from refcntd.binary.elf import read_build_id

DEFAULT_TIMEOUT_S = 5.0
CHUNK = 1 << 16
_BUILD_ID = re.compile(r"^[0-9a-f]{8,64}$")


class Pending(Exception):
    """The download has not finished within its deadline; ask again later."""


class DebuginfodClient:
    def __init__(self, urls: list[str], cache_dir: Path, timeout_s: float = DEFAULT_TIMEOUT_S
                 ) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.cache_dir = cache_dir
        self.timeout_s = timeout_s
        self._slow: set[str] = set()  # servers that timed out: skipped from then on
        self._jobs: dict[str, tuple[float, Future[str | None]]] = {}
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="debuginfod")

    @classmethod
    def from_env(cls) -> DebuginfodClient | None:
        urls = os.environ.get("DEBUGINFOD_URLS", "").split()
        if not urls:
            return None
        try:
            timeout = float(os.environ.get("REFCNTD_DEBUGINFOD_TIMEOUT", DEFAULT_TIMEOUT_S))
        except ValueError:
            timeout = DEFAULT_TIMEOUT_S
        return cls(urls, paths.CACHE_DIR / "debuginfod", max(0.1, timeout))

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
            future = self._pool.submit(self._download, build_id, time.monotonic()
                                       + self.timeout_s)
            self._jobs[build_id] = (time.monotonic() + self.timeout_s, future)
        deadline, future = self._jobs[build_id]
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            raise Pending(build_id) from None

    def running(self, build_id: str) -> bool:
        job = self._jobs.get(build_id)
        return job is not None and not job[1].done()

    def _download(self, build_id: str, deadline: float) -> str | None:
        for url in self.urls:
            if url in self._slow:
                continue
            try:
                data = _fetch(f"{url}/buildid/{build_id}/debuginfo", deadline)
            except TimeoutError:
                self._slow.add(url)
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


def _fetch(url: str, deadline: float) -> bytes | None:
    """The body, or None for a miss or an error; TimeoutError past the deadline."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError(url)
    try:
        with urllib.request.urlopen(url, timeout=remaining) as resp:  # noqa: S310 - user's URL
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

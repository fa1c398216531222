"""Real GStreamer pipelines for the gst soak and its CPU cost (benchmarks/gstsoak.py,
gstcost.py): Debian's gst-launch-1.0 with audiotestsrc or videotestsrc, live, stopped
by SIGINT with -e (an EOS, then a normal exit), each buffer's arrival timed from
fakesink's -v lines, and GStreamer's own leaks tracer read from its debug file."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

GST = Path("/usr/bin/gst-launch-1.0")
PIPELINES = {
    "audio": ["audiotestsrc", "is-live=true", "!", "audioconvert", "!", "audioresample",
              "!", "fakesink"],
    "video": ["videotestsrc", "is-live=true", "!", "videoconvert", "!", "queue", "!",
              "fakesink"],
}
CLK_TCK = os.sysconf("SC_CLK_TCK")
# the leaks tracer's records (GST_DEBUG=GST_TRACER:7), one per object alive at
# gst_deinit() or at a SIGUSR1 (GST_LEAKS_TRACER_SIG set); "object-alive.class" is the
# record's format, printed once at start
ALIVE = re.compile(r"object-alive, type-name=\(string\)(\w*),")
# the libraries the gstreamer spec probes: a private copy of each (another inode, so no
# uprobe of anyone's) gives a truly untraced process through LD_LIBRARY_PATH
PROBED_LIBS = ("libgstreamer-1.0.so.0", "libgobject-2.0.so.0")


def leaks_env(trace_file: Path) -> dict[str, str]:
    """GStreamer's leaks tracer on, its records written to `trace_file`."""
    return {"GST_TRACERS": "leaks", "GST_DEBUG": "GST_TRACER:7", "GST_DEBUG_NO_COLOR": "1",
            "GST_DEBUG_FILE": str(trace_file), "GST_LEAKS_TRACER_SIG": "1"}


def alive(trace_file: Path) -> Counter[str]:
    """Objects alive per GStreamer type name in the leaks tracer's records so far."""
    try:
        text = trace_file.read_text(errors="replace")
    except FileNotFoundError:
        return Counter()
    return Counter(m.group(1) for m in ALIVE.finditer(text))


def cpu_ticks(pid: int) -> int:
    """utime + stime of `pid` (all its threads), in clock ticks."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(stat[11]) + int(stat[12])


def private_libs(into: Path) -> Path:
    """Copies of the probed libraries in `into` (for LD_LIBRARY_PATH)."""
    into.mkdir(parents=True, exist_ok=True)
    for name in PROBED_LIBS:
        src = Path("/usr/lib/x86_64-linux-gnu") / name
        (into / name).write_bytes(src.resolve().read_bytes())
    return into


class Pipeline:
    """One gst-launch-1.0 run of PIPELINES[kind]. When `timed` (`-v`, `fakesink
    silent=false`: each buffer a line on stdout) a meter process of its own (this file
    run as a program: the soak's own pauses must not count) writes the largest gap
    between two buffers each second to `gaps`: what a stop of the process costs the
    stream."""

    def __init__(self, kind: str, program: Path, env: dict[str, str] | None = None,
                 gaps: Path | None = None) -> None:
        self.kind = kind
        args = [str(program), "-e", *(["-v"] if gaps else []), *PIPELINES[kind]]
        if gaps:
            args.append("silent=false")
        self.proc = subprocess.Popen(args, env={**os.environ, **(env or {})},
                                     stdout=subprocess.PIPE if gaps else subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid
        self.started = time.monotonic()
        self.gaps, self._read_to, self.buffers = gaps, 0, 0
        self.meter = None
        if gaps:
            self.meter = subprocess.Popen([sys.executable, __file__, str(gaps)],
                                          stdin=self.proc.stdout)
            assert self.proc.stdout is not None
            self.proc.stdout.close()  # the meter's now

    def take_gap(self) -> float | None:
        """The largest gap between two buffers (ms) since the last call."""
        if self.gaps is None or not self.gaps.exists():
            return None
        with self.gaps.open() as f:
            f.seek(self._read_to)
            lines = f.read().splitlines()
            self._read_to = f.tell()
        rows = [line.split() for line in lines if line.count(" ") == 2]
        if rows:
            self.buffers = int(rows[-1][2])
        return max((float(r[1]) for r in rows), default=None)

    def stop(self, timeout: float = 60) -> int:
        """SIGINT (with -e: an EOS through the pipeline, a normal exit); its status."""
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        if self.meter:
            self.meter.wait(30)
            self.take_gap()
        return code

    def kill(self) -> None:
        for proc in (self.proc, self.meter):
            if proc and proc.poll() is None:
                proc.kill()
                proc.wait()


def meter(out: Path) -> None:
    """Read fakesink's -v lines on stdin; each second, append "time gap_ms buffers"."""
    last = flushed = time.monotonic()
    gap, count = 0.0, 0
    with out.open("a") as f:
        for line in sys.stdin:
            if "last-message = chain" not in line:
                continue
            now = time.monotonic()
            if count:
                gap = max(gap, now - last)
            last, count = now, count + 1
            if now - flushed >= 1.0:
                f.write(f"{now:.3f} {gap * 1000:.1f} {count}\n")
                f.flush()
                flushed, gap = now, 0.0
        f.write(f"{time.monotonic():.3f} {gap * 1000:.1f} {count}\n")


if __name__ == "__main__":
    meter(Path(sys.argv[1]))

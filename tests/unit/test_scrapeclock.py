"""When serve's HTTP readers are next due (scrapeclock.py): what the garbage
collector's pauses are placed around."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from refcntd.service import httpserver
from refcntd.service.scrapeclock import ScrapeClock


def _every(clock: ScrapeClock, period: float, times: int, agent: str = "Prometheus") -> float:
    now = 0.0
    for i in range(times):
        now = i * period
        clock.started("::1", agent, "/metrics", now)
        clock.ended()
    return now


def test_a_periodic_reader_is_waited_for_and_a_stopped_one_is_not():
    clock = ScrapeClock()
    last = _every(clock, 5.0, 4)
    assert clock.clear_for(0.3, last + 1.0)
    assert not clock.clear_for(0.3, last + 4.7)  # due at +5
    assert not clock.clear_for(0.3, last + 6.0)  # overdue: due now
    assert clock.clear_for(0.3, last + 16.0)  # three periods silent: it stopped


def test_a_new_reader_has_no_period_and_a_request_in_progress_blocks():
    clock = ScrapeClock()
    clock.started("::1", "curl", "/metrics", 0.0)
    clock.ended()
    assert clock.clear_for(10.0, 0.1)
    clock.started("::1", "curl", "/metrics", 1.0)
    assert not clock.clear_for(0.0, 1.01)
    clock.ended()


def test_readers_are_bounded():
    clock = ScrapeClock()
    for i in range(500):
        clock.started(f"10.0.0.{i}", "x", "/", float(i))
        clock.ended()
    assert len(clock._readers) <= 64


def test_the_http_application_feeds_the_clock():
    clock = ScrapeClock()
    ready = httpserver.Readiness()
    ready.set()
    app = httpserver.application(CollectorRegistry(), ready, clock=clock)
    environ = {"PATH_INFO": "/metrics", "REMOTE_ADDR": "127.0.0.1",
               "HTTP_USER_AGENT": "Prometheus/2.42.0", "REQUEST_METHOD": "GET"}
    for _ in range(3):
        list(app(environ, lambda *_: None))  # type: ignore[arg-type]
    (reader,) = clock._readers.values()
    assert len(reader.intervals) == 2 and clock._in_flight == 0

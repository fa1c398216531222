"""The benchmark's loop: executed sites, baselines, one mutant per build."""

from __future__ import annotations

import dataclasses
import datetime
import json
import random
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import codebases
import coverage
import report
import score
import sites
import truth
from codebases import Codebase, Workload
from sites import Site

REPO = codebases.REPO
SEED = 31


@dataclass
class Executed:
    site: Site
    hits: dict[str, int]  # workload label -> times the site ran
    symbol: str  # the function the site's code ends up in (after inlining)

    @property
    def first(self) -> str:
        return next(label for label, n in self.hits.items() if n)


@dataclass
class Baseline:
    books: dict[str, truth.Books] = field(default_factory=dict)
    groups: dict[str, list[score.Group]] = field(default_factory=dict)
    repeatable: dict[str, bool] = field(default_factory=dict)


# ---- executed sites ---------------------------------------------------------

def executed_sites(cb: Codebase, verbose: bool = False) -> list[Executed]:
    """The sites the workloads run, measured once per build of the baseline (cached)."""
    cache = cb.work / "executed.json"
    all_sites = sites.all_sites(cb.source, cb.files(), cb.api)
    by_key = {s.key: s for s in all_sites}
    if cache.exists():
        return _kept(cb, by_key, json.loads(cache.read_text())["executed"])
    by_line: dict[tuple[str, int], list[Site]] = {}
    for s in all_sites:
        by_line.setdefault((s.file, s.line), []).append(s)
    role_of = {n: cb.role(n) for n in cb.api.gets | cb.api.puts}
    insns = [i for b in cb.binaries for i in coverage.call_insns(b, frozenset(cb.targets))]
    mapped = [coverage.site_of(i, by_line, cb.source, cb.targets, role_of) for i in insns]
    hits: dict[str, dict[str, int]] = {}
    symbol: dict[str, str] = {}
    inlined: set[str] = set()  # sites with a call instruction in an inlined copy
    for w in cb.workloads:
        counts = coverage.measure([(w.argv, cb.run_env())], insns)
        for idx, found in enumerate(mapped):
            for s in found:
                hits.setdefault(s.key, {x.label: 0 for x in cb.workloads})
                hits[s.key][w.label] += counts.get(idx, 0)
                symbol[s.key] = insns[idx].chain[-1][0] if insns[idx].chain else ""
                if len(insns[idx].chain) > 1:
                    inlined.add(s.key)
    rows = [{"site": k, "hits": h, "symbol": symbol[k], "inlined": k in inlined}
            for k, h in sorted(hits.items()) if any(h.values())]
    summary = {"sites": len(all_sites), "with_code": len(hits), "executed": len(rows),
               "call_instructions": len(insns),
               "per_workload": {w.label: sum(1 for r in rows if r["hits"][w.label])
                                for w in cb.workloads}}
    cache.write_text(json.dumps({"summary": summary, "executed": rows}, indent=1))
    if verbose:
        print(f"{cb.name}: {summary}")
    return _kept(cb, by_key, rows)


def _kept(cb: Codebase, by_key: dict[str, Site], rows: list[dict[str, Any]]) -> list[Executed]:
    """The cached rows as sites; for a C++ codebase (cb.cxx) only those in their own
    function's code, named by its symbol (score.plain: no clone suffix)."""
    if cb.cxx:
        return [Executed(dataclasses.replace(by_key[r["site"]],
                                             function=score.plain(r["symbol"])),
                         r["hits"], r["symbol"]) for r in rows
                if r["site"] in by_key and r["symbol"] and not r.get("inlined", True)]
    return [Executed(by_key[r["site"]], r["hits"], r["symbol"]) for r in rows
            if r["site"] in by_key]


def coverage_summary(cb: Codebase) -> dict[str, Any]:
    return dict(json.loads((cb.work / "executed.json").read_text())["summary"])


# ---- one traced run ---------------------------------------------------------

class TimedOut(Exception):
    """refcntd did not finish its run within REFCNTD_TIMEOUT."""


REFCNTD_TIMEOUT = 420  # s per run (--timeout); mutants leaking thousands of objects take long


def evidence_of(json_out: Path) -> Path:
    """Where a run's inference inputs are kept (REFCNTD_DUMP_EVIDENCE), beside its --json."""
    return json_out.with_suffix(".evidence.jsonl")


def refcntd_run(cb: Codebase, w: Workload, json_out: Path) -> list[score.Group]:
    """One traced run; its --json and its inference inputs stay beside each other."""
    cmd = [sys.executable, "-m", "refcntd", "run", "--spec", str(cb.spec), "--history", "all",
           "--json", str(json_out), "--quiet", "--wait-descendants", "5", "--", *w.argv]
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.unlink(missing_ok=True)
    evidence_of(json_out).unlink(missing_ok=True)
    env = {**cb.run_env(), "REFCNTD_DUMP_EVIDENCE": str(evidence_of(json_out))}
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=REFCNTD_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise TimedOut() from None
    if not json_out.exists():
        raise RuntimeError(f"refcntd run failed ({proc.returncode}): {proc.stderr[-1500:]}")
    evidence_of(json_out).touch()  # none written: no leaked object had history to judge
    return score.groups(json_out)


def count(cb: Codebase, w: Workload) -> truth.Books:
    probes, rules = codebases.probes(cb)
    return truth.count(w.argv, probes, rules, env=cb.run_env())


def baseline(cb: Codebase, repeats: int, scratch: Path,
             labels: set[str] | None = None) -> Baseline:
    """The unmutated build's truth and refcntd runs of every workload, or of those
    `labels` name.  A kept refcntd run of the unmutated build (OUT/runs/CB/baseline/
    LABEL/rN.json, with operation counts) is used again: a stopped `run` restarted
    does not trace its baselines again."""
    base = Baseline()
    for w in cb.workloads:
        if labels is not None and w.label not in labels:
            continue
        first, second = count(cb, w), count(cb, w)
        base.books[w.label] = first
        runs = [_counted_run(cb, w, runs_dir(scratch, cb.name, "baseline", w.label) /
                             f"r{r}.json") for r in range(repeats)]
        base.groups[w.label] = runs[0]
        base.repeatable[w.label] = (first.objects == second.objects
                                    and all(score.signature(g) == score.signature(runs[0])
                                            for g in runs))
    return base


# ---- one mutant ---------------------------------------------------------------

def runs_dir(scratch: Path, *names: str) -> Path:
    """OUT/runs/...: the kept refcntd runs of a mutant or a baseline workload (scratch is
    OUT/scratch/CODEBASE), named after the mutant id or the workload label."""
    safe = [n.replace("/", "_").replace(":", "_").replace(" ", "_") for n in names]
    return scratch.parent.parent.joinpath("runs", *safe)


def mutant_id(cb: Codebase, ex: Executed) -> str:
    s = ex.site
    return f"{cb.name}:{s.file}:{s.line}:{s.col}"


def apply(cb: Codebase, site: Site) -> str:
    """Write the mutant into the tree; returns the pattern."""
    pattern = sites.pattern_of(site, cb.api)
    pristine = codebases.keep_pristine(cb, site.file)
    (cb.source / site.file).write_text(sites.mutate(pristine.read_text(), site, pattern, cb.api))
    return pattern


def restore(cb: Codebase, site: Site) -> None:
    """The unmutated text, with a new mtime: the next build compiles it again."""
    pristine = codebases.keep_pristine(cb, site.file)
    (cb.source / site.file).write_text(pristine.read_text())


def run_mutant(cb: Codebase, ex: Executed, base: Baseline, repeats: int, scratch: Path
               ) -> dict[str, Any]:
    site = ex.site
    row: dict[str, Any] = {"id": mutant_id(cb, ex), "codebase": cb.name, "file": site.file,
                           "line": site.line, "call": site.name, "function": site.function,
                           "symbol": ex.symbol, "type": cb.api.type_of[site.name],
                           "workload": ex.first, "hits": ex.hits[ex.first]}
    row["pattern"] = apply(cb, site)
    try:
        row["build_s"] = cb.build()
    except subprocess.CalledProcessError as err:
        restore(cb, site)
        return {**row, "status": "build failed", "error": (err.stderr or "")[-400:]}
    try:
        return {**row, **judge(cb, row, base, repeats, scratch)}
    finally:
        restore(cb, site)


def judge(cb: Codebase, row: dict[str, Any], base: Baseline, repeats: int, scratch: Path
          ) -> dict[str, Any]:
    w = next(x for x in cb.workloads if x.label == row["workload"])
    started = time.monotonic()
    out = {**truth_of(row, base.books[w.label], count(cb, w)),
           "truth_s": round(time.monotonic() - started, 1)}
    if "status" in out:
        return out
    new = out["new_leaks"]
    started = time.monotonic()
    try:
        full = [refcntd_run(cb, w, runs_dir(scratch, row["id"]) / f"r{r}.json")
                for r in range(repeats)]
    except TimedOut:
        return {**out, "status": "scored", "outcome": "missed", "timed_out": True,
                "said": f"refcntd run did not finish in {REFCNTD_TIMEOUT} s",
                "indirect": [{"type": t, "objects": n, "outcome": "missed",
                              "marked_indirect": False, "said": "timed out"}
                             for t, n in sorted(new.items()) if t != row["type"]],
                "repeat_outcomes": ["missed"], "deterministic": True, "named_inliner": False}
    out["refcntd_s"] = round(time.monotonic() - started, 1)
    runs = [score.new_groups(base.groups[w.label], f) for f in full]
    return {**out, "status": "scored",
            **verdicts(runs, row, new, score.new_counts(base.groups[w.label], full[0]))}


def truth_of(row: dict[str, Any], base: truth.Books, books: truth.Books) -> dict[str, Any]:
    """A mutant's truth against its workload's baseline: the new leaks, and a status
    when it is not scored (events lost, or no new leak: equivalent)."""
    new = truth.new_leaks(base, books)
    out: dict[str, Any] = {"truth": books.summary(), "new_leaks": new, "exit": books.returncode}
    if books.lost:
        out["status"] = "truth lost events"
    elif not new:
        out["status"] = "equivalent"
    else:
        out["leak"] = "direct" if row["type"] in new else "indirect only"
    return out


def verdicts(runs: list[list[score.Group]], row: dict[str, Any], new: dict[str, int],
             counted: dict[str, int] | None = None) -> dict[str, Any]:
    """Outcomes of the first run; whether the repeats said the same; and whether
    refcntd's new leaked objects per type (`counted`, first run) are the truth's:
    the truth run and refcntd's run are two executions, which a timing-dependent
    leak can make differ."""
    found = runs[0]
    direct = score.answer(found, row["type"])
    out: dict[str, Any] = {"outcome": score.outcome(direct, row["function"]),
                           "said": score.said(direct)}
    # the function the mutated one was inlined into, named instead of it
    out["named_inliner"] = (row["symbol"] != row["function"] and direct is not None
                            and direct.culprits[:1] == (score.plain(row["symbol"]),))
    out["indirect"] = [{"type": t, "objects": n,
                        "outcome": score.outcome(score.answer(found, t), row["function"]),
                        "marked_indirect": (g := score.answer(found, t)) is not None
                        and g.status in ("indirect", "cycle"),
                        "said": score.said(score.answer(found, t))}
                       for t, n in sorted(new.items()) if t != row["type"]]
    sigs = [score.signature(r) for r in runs]
    out["repeat_outcomes"] = [score.outcome(score.answer(r, row["type"]), row["function"])
                              for r in runs]
    out["repeat_said"] = [score.said(score.answer(r, row["type"])) for r in runs]
    out["deterministic"] = all(s == sigs[0] for s in sigs)
    if counted is not None:
        out["refcntd_new"] = counted
        out["same_leaks"] = counted == dict(sorted(new.items()))
    return out


# ---- the whole benchmark ------------------------------------------------------

def chosen(executed: list[Executed], limit: int) -> list[Executed]:
    """The executed sites in a seeded random order (a run stopped early is still a fair
    sample), the first `limit` of them when limited."""
    order = random.Random(SEED).sample(executed, len(executed))
    return order[:limit] if limit else order


def run_all(cbs: list[Codebase], out: Path, limit: int, repeats: int, seconds: int,
            retry_timed_out: bool = False, retry_missed: bool = False,
            excluded: frozenset[str] | set[str] = frozenset(), baselines: int = 0) -> int:
    """The codebases' mutants in turn, each workload's baseline made just before the
    first mutant that runs it (a run stopped early made no baseline it did not use).
    retry_timed_out / retry_missed: mutants whose refcntd run timed out, or whose
    outcome was "missed", are run again (the rows say `rerun` with the refcntd
    commit that made the new run); `excluded` mutant ids are never run (held out:
    the first `limit` sites of the seeded order not tried before); `baselines`:
    refcntd runs per baseline workload (default `repeats`), what `against` compares
    with (made here, `rebase` has none to make)."""
    results = out / "mutants.json"
    doc = _load_or_new(results, repeats)
    names = {cb.name for cb in cbs}
    retried = {r["id"] for r in doc["mutants"] if r["codebase"] in names and (
        (retry_timed_out and r.get("timed_out"))
        or (retry_missed and r.get("outcome") == "missed"))}
    retry = retry_timed_out or retry_missed
    doc["mutants"] = [r for r in doc["mutants"] if r["id"] not in retried]
    started = time.monotonic()
    queues: list[tuple[Codebase, Baseline, Path, list[Executed]]] = []
    for cb in cbs:
        scratch = out / "scratch" / cb.name
        scratch.mkdir(parents=True, exist_ok=True)
        for rel in codebases.restore_all(cb):
            print(f"{cb.name}: {rel} restored (left mutated by a stopped run)", flush=True)
        cb.build()
        executed = executed_sites(cb)
        done = {r["id"] for r in doc["mutants"]}
        order = [e for e in chosen(executed, 0) if mutant_id(cb, e) not in excluded]
        todo = [e for e in (order[:limit] if limit else order) if mutant_id(cb, e) not in done
                and (not retry or mutant_id(cb, e) in retried)]
        # no baseline of a workload no mutant runs (a sampled set of fontconfig's 45
        # workloads uses about half of them), each made when first needed; the
        # baselines an earlier run recorded stay in the doc until made again
        kept = doc["codebases"].get(cb.name, {}).get("baseline", {})
        base = Baseline()
        doc["codebases"][cb.name] = _codebase_doc(cb, base)
        doc["codebases"][cb.name]["baseline"] = kept
        queues.append((cb, base, scratch, todo))
    _save(doc, results, out)
    for turn in range(max((len(q[3]) for q in queues), default=0)):
        for cb, base, scratch, todo in queues:
            if turn >= len(todo):
                continue
            if seconds and time.monotonic() - started > seconds:
                doc["stopped_early"] = True
                _save(doc, results, out)
                return 0
            label = todo[turn].first
            if label not in base.books:
                cb.build()  # the unmutated build again (the last mutant's was restored)
                made = baseline(cb, baselines or repeats, scratch, {label})
                base.books |= made.books
                base.groups |= made.groups
                base.repeatable |= made.repeatable
                doc["codebases"][cb.name]["baseline"] |= _codebase_doc(cb, made)["baseline"]
                _save(doc, results, out, finished=False)
            row = run_mutant(cb, todo[turn], base, repeats, scratch)
            if row["id"] in retried:
                row["rerun"] = report.machine().get("refcntd_commit", "")
            doc["mutants"].append(row)
            _save(doc, results, out)
            print(f"{row['id']} {row['pattern']}: {row['status']} {row.get('outcome', '')} "
                  f"{row.get('said', '')}", flush=True)
    for cb, *_ in queues:
        cb.build()
    return 0


def retruth(cbs: list[Codebase], out: Path) -> int:
    """Count the truth again for the baselines and every scored mutant (rebuilt, not
    traced by refcntd): after the truth's probes changed.  A mutant whose new leaks
    are gone becomes equivalent; its kept refcntd runs stay, unscored.  The rows say
    `retruth` with the commit whose truth counted them."""
    results = out / "mutants.json"
    doc = _load_or_new(results, 1)
    commit = report.machine().get("refcntd_commit", "")
    for cb in cbs:
        for rel in codebases.restore_all(cb):
            print(f"{cb.name}: {rel} restored (left mutated by a stopped run)", flush=True)
        cb.build()
        books = {w.label: count(cb, w) for w in cb.workloads
                 if w.label in doc["codebases"][cb.name]["baseline"]}
        for label, b in books.items():
            doc["codebases"][cb.name]["baseline"][label]["truth"] = b.summary()
        doc["codebases"][cb.name]["retruth"] = commit
        by_id = {mutant_id(cb, e): e for e in executed_sites(cb)}
        for row in doc["mutants"]:
            if row["codebase"] != cb.name or row["status"] != "scored":
                continue
            ex = by_id[row["id"]]
            apply(cb, ex.site)
            try:
                cb.build()
                w = next(x for x in cb.workloads if x.label == row["workload"])
                mutant = count(cb, w)
            finally:
                restore(cb, ex.site)
            old = row["new_leaks"]
            row.update({**truth_of(row, books[w.label], mutant), "retruth": commit})
            _save(doc, results, out, finished=False)
            print(f"{row['id']}: truth {old} -> {row['new_leaks']} ({row['status']})",
                  flush=True)
        cb.build()
    return 0


def rebase(cbs: list[Codebase], out: Path, repeats: int) -> int:
    """Run refcntd on the unmutated builds again (every workload, `repeats` runs):
    the runs mutants are compared with must carry each type's operations per path;
    a run kept that does is kept as it is (what was judged against it stays
    comparable), the others are made.  The first run's refcntd groups are
    recorded again; the truth is not recounted (retruth does that)."""
    results = out / "mutants.json"
    doc = _load_or_new(results, 1)
    commit = report.machine().get("refcntd_commit", "")
    for cb in cbs:
        scratch = out / "scratch" / cb.name
        for rel in codebases.restore_all(cb):
            print(f"{cb.name}: {rel} restored (left mutated by a stopped run)", flush=True)
        cb.build()
        for w in cb.workloads:
            if w.label not in doc["codebases"][cb.name]["baseline"]:
                continue  # no mutant runs it (run_all made no baseline of it)
            runs = [_counted_run(cb, w, runs_dir(scratch, cb.name, "baseline", w.label) /
                                 f"r{r}.json") for r in range(repeats)]
            entry = doc["codebases"][cb.name]["baseline"][w.label]
            entry["refcntd_groups"] = [asdict(g) for g in runs[0]]
            entry["rebase"] = commit
            _save(doc, results, out, finished=False)
            print(f"{cb.name} {w.label}: {len(runs[0])} groups", flush=True)
    return 0


def _counted_run(cb: Codebase, w: Workload, json_out: Path) -> list[score.Group]:
    """A kept run whose --json has operation counts, else a new one."""
    if json_out.exists() and any(p.get("operations") for p in
                                 json.loads(json_out.read_text())["processes"]):
        return score.groups(json_out)
    return refcntd_run(cb, w, json_out)


def _load_or_new(path: Path, repeats: int) -> dict[str, Any]:
    if path.exists():
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc
    return {"machine": report.machine(), "started": datetime.datetime.now().isoformat(
        timespec="seconds"), "repeats": repeats, "codebases": {}, "mutants": []}


def _codebase_doc(cb: Codebase, base: Baseline) -> dict[str, Any]:
    return {"prepared": cb.prepared, "spec": str(cb.spec), "coverage": coverage_summary(cb),
            "workloads": {w.label: " ".join(w.argv) for w in cb.workloads},
            "baseline": {label: {"truth": b.summary(),
                                 "refcntd_groups": [asdict(g) for g in base.groups[label]],
                                 "repeatable": base.repeatable[label]}
                         for label, b in base.books.items()}}


def _save(doc: dict[str, Any], path: Path, out: Path, finished: bool = True) -> None:
    """finished: a run of mutants ends now (not for retruth or rebase)."""
    if finished:
        doc["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    path.write_text(json.dumps(doc, indent=1))
    (out / "mutants.md").write_text(report.markdown(doc))


# ---- smoke ----------------------------------------------------------------------

def smoke(out: Path, repeats: int) -> int:
    """Three perf mutants from binaries cached under OUT/smoke (built once)."""
    cb = codebases.load("perf", out)
    executed = executed_sites(cb)
    picks = smoke_picks(cb, executed)
    cache = out / "smoke"
    base_bin = cache / "baseline" / "perf"
    built = cb.build_dir / "perf"
    if not base_bin.exists():
        cb.build()
        base_bin.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, base_bin)
    rows = []
    for ex in picks:
        binary = cache / mutant_id(cb, ex).replace("/", "_").replace(":", "_") / "perf"
        if not binary.exists():
            apply(cb, ex.site)
            try:
                cb.build()
                binary.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(built, binary)
            finally:
                restore(cb, ex.site)
        rows.append(smoke_one(cb, ex, base_bin, binary, repeats, cache))
    doc = {"machine": report.machine(), "smoke": rows}
    (cache / "smoke.json").write_text(json.dumps(doc, indent=1))
    for r in rows:
        print(f"{r['id']} {r['pattern']}: new leaks {r['new_leaks']}, refcntd {r['said']} "
              f"({r['outcome']})")
    return 0


# (call, function): one site each in perf 6.12 that perf report runs once, each seen to
# leak (a thread with its maps and comm; a map with its dso; a dso)
SMOKE = (("thread__put", "perf_session__register_idle_thread"),
         ("map__put", "machine__update_kernel_mmap"), ("dso__get", "dsos__find_kernel_dso_cb"))


def smoke_picks(cb: Codebase, executed: list[Executed]) -> list[Executed]:
    picks = [next((e for e in executed if (e.site.name, e.site.function) == pick), None)
             for pick in SMOKE]
    if None in picks:
        raise SystemExit(f"smoke: not all of {SMOKE} run by the workload in this perf")
    return [e for e in picks if e is not None]


def smoke_one(cb: Codebase, ex: Executed, base_bin: Path, binary: Path, repeats: int,
              cache: Path) -> dict[str, Any]:
    scratch = cache / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    w = next(x for x in cb.workloads if x.label == ex.first)
    base = Baseline()
    on_base, on_mut = with_binary(cb, w, base_bin), with_binary(cb, w, binary)
    on = dataclasses.replace(cb, binaries=[base_bin])
    base.books[w.label] = count(on, on_base)
    base.groups[w.label] = refcntd_run(on, on_base, scratch / "base.json")
    cb = dataclasses.replace(cb, binaries=[binary])
    row = {"id": mutant_id(cb, ex), "function": ex.site.function, "type":
           cb.api.type_of[ex.site.name], "pattern": sites.pattern_of(ex.site, cb.api),
           "workload": w.label}
    books = count(cb, on_mut)
    new = truth.new_leaks(base.books[w.label], books)
    runs = [score.new_groups(base.groups[w.label], refcntd_run(cb, on_mut, scratch / f"m{r}.json"))
            for r in range(repeats)]
    direct = score.answer(runs[0], row["type"])
    return {**row, "new_leaks": new, "truth_lost": books.lost,
            "refcntd_types": sorted({g.type for g in runs[0]}),
            "outcome": score.outcome(direct, row["function"]), "said": score.said(direct)}


def with_binary(cb: Codebase, w: Workload, binary: Path) -> Workload:
    old = str(cb.build_dir / "perf")
    return Workload(w.label, tuple(str(binary) if a == old else a for a in w.argv))

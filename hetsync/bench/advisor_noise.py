"""How much a check of a few seeds can resolve: the advisor judged on every recorded seed, and the judge's noise.

``python -m hetsync.bench.advisor_noise [--docs-dir docs] [--np 4 8] [--k 3] [--update-docs]``

The advisor's check (:mod:`hetsync.bench.advisor_check`) judges a first choice by the median time to target of
k = 3 seeds per protocol, and passes it within :data:`~hetsync.bench.advisor_check.WITHIN` (10%) of the measured
best (and never BSP where a protocol was 1.5x faster: :func:`~hetsync.bench.advisor_check.verdict`). Where
protocols finish within 10-25% of each other, a median of three seeds moves by about as much between seed sets,
so the verdict is itself a draw. This tool runs nothing: it pools every run that the check's documents record at
one world size (``docs/simulator/advisor_calibration[_npN].json``, ``advisor_check[_npN].json`` and
``advisor_check_fresh[_npN].json``: the same job, scenarios, protocols, epochs and learning rate under disjoint
seeds) per scenario and protocol, over the seeds under which every protocol of the scenario ran, and reports:

1. **The pooled judge**: each check document's first choice judged by the verdict against the medians over every
   pooled seed. These are more seeds than one check has, not unseen ones: the check's own seeds (1-3) were read
   while the advisor's rule was chosen; the fresh check's seeds were not.
2. **A perfect advisor on one check**: over every k-seed subset S of a scenario's seeds, the share on which the
   pooled best passes a check of S (:func:`pass_probability`; in sample, so optimistic: the best was picked on
   seeds that include S), and the share on which the best over the *other* seeds passes (:func:`held_out_probability`;
   an advisor that knows the medians of every seed but S). The largest in-sample share of any fixed choice is
   shown too.
3. **A second check as the advisor** (:func:`second_check_probability`): the share of pairs of disjoint k-seed
   subsets on which the best of the first passes on the second.
4. **The target on one check** (:func:`pass_counts`): over every k-subset of the seeds all scenarios share, how
   many scenarios a perfect advisor passes; the share of those checks on which it passes at least
   :data:`TARGET_SHARE` of the scenarios (the advisor's target). The scenarios of one check share its seeds, so
   this is counted over the shared subsets, not multiplied out; world sizes are combined as independent
   (:func:`combined`).

Ties go to the protocol whose name sorts first. ``--update-docs`` writes the generated block of
``docs/simulator.md`` (between :data:`BEGIN` and :data:`END`).
"""
import argparse
import itertools
import json
import math
import os
import statistics
import sys

from tabulate import tabulate

from hetsync.bench import docpages
from hetsync.bench.advisor_check import doc_names, median_time, verdict

__all__ = ["BEGIN", "END", "SETUP_KEYS", "TARGET_SHARE", "pooled_runs", "complete_seeds", "pass_probability",
           "held_out_probability", "second_check_probability", "pass_counts", "at_least", "convolve", "report",
           "table", "combined", "update_docs", "main"]

#: the generated block's markers in ``docs/simulator.md``.
BEGIN, END = "<!-- BEGIN generated: advisor noise -->", "<!-- END generated: advisor noise -->"
#: what every pooled document must share: the runs are one job under different seeds.
SETUP_KEYS = ("np", "epochs", "lr", "dataset", "target", "dilation")
#: the advisor's target: its first choice passes in at least this share of the check's scenarios.
TARGET_SHARE = 0.8


def _documents(docs_dir, n):
    check, calibration, _, _ = doc_names(n)
    fresh = doc_names(n, fresh=True)[0]
    return [name for name in (calibration, check, fresh) if os.path.exists(os.path.join(docs_dir, "simulator", name))]


def pooled_runs(docs_dir, n):
    """Every run the advisor check's documents record at world size ``n``, pooled by scenario and protocol.

    Args:
        docs_dir: str, the documentation folder (documents under ``docs_dir/simulator``). n: int ranks.

    Returns:
        ``(docs, times)``: ``docs`` a list of ``(document name, document dict)`` in the order calibration, check,
        fresh check (those that exist); ``times`` ``{scenario: {protocol: {seed (int): time to target in seconds
        (float) or None when the run missed the target}}}``.

    Raises:
        FileNotFoundError: none of the three documents exists for ``n`` ranks.
        ValueError: a document is of another world size, the documents differ in a :data:`SETUP_KEYS` setting
            (naming it and both values), two record the same scenario, protocol and seed with different times,
            or a document cannot be read (not JSON, a run without scenario, protocol or seed).
    """
    names = _documents(docs_dir, n)
    if not names:
        raise FileNotFoundError(f"no advisor check or calibration document for {n} ranks under "
                                f"{os.path.join(docs_dir, 'simulator')}; run python -m hetsync.bench.advisor_check "
                                f"--np {n} --update-docs first")
    docs, times, setup, origin = [], {}, None, {}
    for name in names:
        try:
            with open(os.path.join(docs_dir, "simulator", name)) as f:
                doc = json.load(f)
            runs = [(r["scenario"], r["protocol"], int(r["seed"]), r.get("time_to_target_s"))
                    for r in doc.get("runs", [])]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"cannot read the runs of {name}: {exc!r}") from exc
        mine = {key: doc.get(key) for key in SETUP_KEYS}
        mine["dilation"] = float(mine["dilation"] or 1.0)
        if mine["np"] != n:
            raise ValueError(f"{name} records np={mine['np']!r} where {n} ranks were asked for")
        if setup is None:
            setup = (name, mine)
        for key in SETUP_KEYS:
            if mine[key] != setup[1][key]:
                raise ValueError(f"{name} has {key}={mine[key]!r} where {setup[0]} has {setup[1][key]!r}: the pooled "
                                 "runs must be one job under different seeds")
        for scenario, protocol, seed, t in runs:
            cell = times.setdefault(scenario, {}).setdefault(protocol, {})
            if seed in cell and cell[seed] != t:
                raise ValueError(f"{name} and {origin[(scenario, protocol, seed)]} record {scenario}/{protocol} seed "
                                 f"{seed} with different times ({t} and {cell[seed]})")
            cell[seed] = t
            origin[(scenario, protocol, seed)] = name
        docs.append((name, doc))
    return docs, times


def complete_seeds(times):
    """The seeds every protocol of a scenario has a run under.

    Args:
        times: ``{protocol: {seed: seconds or None}}`` (one scenario of :func:`pooled_runs`).

    Returns:
        sorted list of int seeds (empty when ``times`` is).
    """
    sets = [set(runs) for runs in times.values()]
    return sorted(set.intersection(*sets)) if sets else []


def _medians(times, seeds):
    return {p: median_time([runs[s] for s in seeds]) for p, runs in times.items()}


def _best(medians):
    return min(medians, key=lambda p: (medians[p], p))


def _subsets(times, k, need=0):
    """The complete seeds and their k-subsets; ValueError unless there are at least k + need seeds."""
    if k < 1:
        raise ValueError(f"k={k}: a check needs at least one seed")
    seeds = complete_seeds(times)
    if len(seeds) < k + need:
        raise ValueError(f"a check of k={k} seeds needs at least {k + need} complete seeds here; this scenario has "
                         f"{len(seeds)} ({', '.join(map(str, seeds)) or 'none'})")
    return seeds, list(itertools.combinations(seeds, k))


def pass_probability(times, choice, k=3):
    """The share of k-seed subsets of the complete seeds on which ``choice`` passes the check's verdict.

    For a choice fixed before the runs this is an unbiased estimate of its chance to pass one check of k seeds;
    for a choice picked on these seeds (the pooled best) it is optimistic.

    Args:
        times: ``{protocol: {seed: seconds or None}}`` (one scenario). choice: str, a protocol of ``times``.
        k: int >= 1, the seeds per check (3 in the advisor's check).

    Returns:
        float in [0, 1] over all C(m, k) subsets of the m complete seeds.

    Raises:
        ValueError: ``k`` < 1, fewer than ``k`` complete seeds, or ``choice`` not measured.
    """
    _, subsets = _subsets(times, k)
    return sum(verdict(_medians(times, sub), choice)["ok"] for sub in subsets) / len(subsets)


def _held_out_passes(times, subset):
    seeds = [s for s in complete_seeds(times) if s not in subset]
    return verdict(_medians(times, subset), _best(_medians(times, seeds)))["ok"]


def held_out_probability(times, k=3):
    """The share of k-seed subsets S on which the best by the medians over the other complete seeds passes on S.

    An advisor that knows every seed's time except the judged check's: a perfect advisor, estimated without
    picking the best on the seeds it is judged by.

    Args:
        times: ``{protocol: {seed: seconds or None}}`` (one scenario). k: int >= 1.

    Returns:
        float in [0, 1], or None when there are no seeds besides a k-subset (at most k complete seeds).

    Raises:
        ValueError: ``k`` < 1.
    """
    if k >= 1 and len(complete_seeds(times)) <= k:
        return None
    _, subsets = _subsets(times, k, need=1)
    return sum(_held_out_passes(times, sub) for sub in subsets) / len(subsets)


def second_check_probability(times, k=3):
    """The share of ordered pairs of disjoint k-seed subsets (A, B) on which the measured best of A passes on B.

    Args:
        times: ``{protocol: {seed: seconds or None}}`` (one scenario). k: int >= 1.

    Returns:
        float in [0, 1], or None when there are fewer than 2 k complete seeds.

    Raises:
        ValueError: ``k`` < 1.
    """
    if k >= 1 and len(complete_seeds(times)) < 2 * k:
        return None
    _, subsets = _subsets(times, k, need=k)
    med = {sub: _medians(times, sub) for sub in subsets}
    passes = [verdict(med[b], _best(med[a]))["ok"] for a in subsets for b in subsets if not set(a) & set(b)]
    return sum(passes) / len(passes)


def pass_counts(cells, k=3, held_out=True):
    """How many scenarios a perfect advisor passes on one check, over every k-subset of the seeds all share.

    Args:
        cells: ``{scenario: {protocol: {seed: seconds or None}}}`` (non-empty). k: int >= 1.
        held_out: bool: the advisor's choice is the best over the scenario's other complete seeds (True), or the
            pooled best of all of them (False: in sample, optimistic).

    Returns:
        ``(dist, shared)``: ``dist`` a list of len(cells) + 1 floats, ``dist[j]`` the share of the checks on which
        exactly j scenarios pass; ``shared`` the number of seeds all scenarios share.

    Raises:
        ValueError: ``cells`` empty, ``k`` < 1, fewer than k shared seeds, or (``held_out``) a scenario with no
            seed besides a k-subset.
    """
    if not cells:
        raise ValueError("no scenario to count")
    shared = sorted(set.intersection(*[set(complete_seeds(t)) for t in cells.values()]))
    if k < 1 or len(shared) < k:
        raise ValueError(f"a check of k={k} seeds needs k >= 1 and at least k seeds every scenario shares; they "
                         f"share {len(shared)}")
    pooled_best = {s: _best(_medians(t, complete_seeds(t))) for s, t in cells.items()}
    if held_out:
        short = [s for s, t in cells.items() if len(complete_seeds(t)) <= k]
        if short:
            raise ValueError(f"scenario {short[0]} has no seed besides a check of k={k} to pick the best on")
    counts = [0] * (len(cells) + 1)
    subsets = list(itertools.combinations(shared, k))
    for sub in subsets:
        counts[sum(_held_out_passes(t, sub) if held_out else verdict(_medians(t, sub), pooled_best[s])["ok"]
                   for s, t in cells.items())] += 1
    return [c / len(subsets) for c in counts], len(shared)


def _need(scenarios, share):
    return math.ceil(share * scenarios - 1e-9)


def at_least(dist, share=TARGET_SHARE):
    """The probability of at least ``share`` of the scenarios passing, from a distribution of pass counts.

    Args:
        dist: list of floats, ``dist[j]`` the probability that exactly j of len(dist) - 1 scenarios pass.
        share: float in (0, 1] (rounded up to whole scenarios: 0.8 of 8 is 7, of 16 is 13).

    Returns:
        float in [0, 1].

    Raises:
        ValueError: ``dist`` has fewer than 2 entries or ``share`` is out of range.
    """
    if len(dist) < 2 or not 0.0 < share <= 1.0:
        raise ValueError(f"a distribution over at least one scenario and a share in (0, 1] needed; got {len(dist)} "
                         f"entries and share {share!r}")
    return sum(dist[_need(len(dist) - 1, share):])


def convolve(a, b):
    """The distribution of pass counts of two independent groups of scenarios (e.g. two world sizes).

    Args:
        a, b: lists of floats, distributions of pass counts (:func:`pass_counts`).

    Returns:
        list of len(a) + len(b) - 1 floats.
    """
    out = [0.0] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            out[i + j] += x * y
    return out


def report(docs_dir, n, k=3):
    """The module's questions for world size ``n``.

    Args:
        docs_dir: str, the documentation folder. n: int ranks. k: int >= 1, seeds per check.

    Returns:
        dict: ``np``, ``k``, ``documents`` (names), ``skipped`` ({scenario: complete seeds} of the scenarios with
        fewer than k + 1, left out), ``rows`` (per scenario: ``scenario``, ``seeds`` (int), ``incomplete`` (seeds
        with runs of only some protocols, left out), ``medians`` ({protocol: seconds, ``math.inf`` not reached}),
        ``best``, ``p_best``, ``p_held_out``, ``robust``, ``p_robust`` (floats), ``p_second`` (float or None),
        ``choices`` ({document name: {``choice``, ``ratio``, ``ok``, and for a fresh check ``unread_ratio``,
        ``unread_ok``: the verdict over the seeds the check's document does not record}})), ``summary`` (``p_best``,
        ``p_held_out``, ``p_robust``: means over the rows; ``p_second`` and ``second_rows``: its mean over the
        rows that have one, and their number; ``dist_held_out``, ``dist_pooled``: :func:`pass_counts`;
        ``shared`` seeds; ``p_target_held_out``, ``p_target_pooled``: :func:`at_least` of them; ``pooled``:
        {document name: [passes, judged]}; ``unread``: the same for the fresh checks over the unread seeds).

    Raises:
        FileNotFoundError, ValueError: as :func:`pooled_runs`; ValueError when ``k`` < 1, no scenario has more
        than ``k`` complete seeds, or the scenarios share fewer than ``k`` seeds.
    """
    if k < 1:
        raise ValueError(f"k={k}: a check needs at least one seed")
    docs, times = pooled_runs(docs_dir, n)
    judged = [(name, doc) for name, doc in docs if "calibration" not in name and doc.get("scenarios")]
    # the seeds read while the advisor's rule was chosen: the (non-fresh) check's
    read = {int(x) for name, doc in docs if _label(name) == "check" for x in doc.get("seeds", [])}
    rows, pooled, skipped, cells = [], {name: [0, 0] for name, _ in judged}, {}, {}
    unread = {name: [0, 0] for name, _ in judged if _label(name) == "fresh check"}
    for scenario in sorted(times):
        cell = times[scenario]
        seeds = complete_seeds(cell)
        if len(seeds) <= k:
            skipped[scenario] = seeds
            continue
        cells[scenario] = cell
        med = _medians(cell, seeds)
        best = _best(med)
        robust = {p: pass_probability(cell, p, k) for p in sorted(cell)}
        top = max(robust, key=lambda p: (robust[p], p == best))
        choices = {}
        for name, doc in judged:
            for s in doc["scenarios"]:
                if s["scenario"] == scenario and s.get("choice") in cell:
                    v = verdict(med, s["choice"])
                    choices[name] = {"choice": s["choice"], "ratio": v["ratio"], "ok": v["ok"]}
                    pooled[name][0] += v["ok"]
                    pooled[name][1] += 1
                    fresh_seeds = [x for x in seeds if x not in read]
                    if name in unread and fresh_seeds:
                        u = verdict(_medians(cell, fresh_seeds), s["choice"])
                        choices[name].update(unread_ratio=u["ratio"], unread_ok=u["ok"])
                        unread[name][0] += u["ok"]
                        unread[name][1] += 1
        incomplete = sorted(set().union(*[set(r) for r in cell.values()]) - set(seeds))
        rows.append({"scenario": scenario, "seeds": len(seeds), "incomplete": incomplete, "medians": med,
                     "best": best, "p_best": robust[best], "p_held_out": held_out_probability(cell, k),
                     "robust": top, "p_robust": robust[top], "p_second": second_check_probability(cell, k),
                     "choices": choices})
    if not rows:
        raise ValueError(f"no scenario at {n} ranks has more than k={k} complete seeds: {skipped}")
    held, shared = pass_counts(cells, k, held_out=True)
    inside, _ = pass_counts(cells, k, held_out=False)
    seconds = [r["p_second"] for r in rows if r["p_second"] is not None]
    return {"np": n, "k": k, "documents": [name for name, _ in docs], "skipped": skipped, "rows": rows,
            "summary": {"p_best": statistics.mean(r["p_best"] for r in rows),
                        "p_held_out": statistics.mean(r["p_held_out"] for r in rows),
                        "p_robust": statistics.mean(r["p_robust"] for r in rows),
                        "p_second": statistics.mean(seconds) if seconds else None, "second_rows": len(seconds),
                        "dist_held_out": held, "dist_pooled": inside, "shared": shared,
                        "p_target_held_out": at_least(held), "p_target_pooled": at_least(inside),
                        "pooled": pooled, "unread": unread}}


def _label(name):
    return "fresh check" if "fresh" in name else "calibration" if "calibration" in name else "check"


def table(rep):
    """A markdown table of :func:`report`'s rows (one per scenario) and a summary paragraph below it.

    Args:
        rep: dict from :func:`report`.

    Returns:
        str, markdown.
    """
    judged = [name for name in rep["documents"] if name in rep["summary"]["pooled"]]
    k, s = rep["k"], rep["summary"]
    body = []
    for r in rep["rows"]:
        cells = []
        for name in judged:
            c = r["choices"].get(name)
            cells.append("-" if c is None else f"{c['choice']} {c['ratio']:.3f}{'' if c['ok'] else ' (fails)'}")
        for name in s["unread"]:
            c = r["choices"].get(name)
            cells.append("-" if c is None or "unread_ratio" not in c else
                         f"{c['unread_ratio']:.3f}{'' if c['unread_ok'] else ' (fails)'}")
        second = "-" if r["p_second"] is None else f"{r['p_second']:.2f}"
        seeds = str(r["seeds"]) + (f" (+{len(r['incomplete'])} incomplete)" if r["incomplete"] else "")
        body.append([r["scenario"], seeds, f"{r['best']} ({r['medians'][r['best']]:.1f} s)",
                     f"{r['p_best']:.2f}", f"{r['p_held_out']:.2f}", second, f"{r['robust']} {r['p_robust']:.2f}",
                     *cells])
    headers = ["scenario", "seeds", "pooled best (median)", "P(pooled best passes)",
               "P(best of the other seeds passes)", "P(second check's best passes)", "most robust choice",
               *[f"{_label(name)}'s choice / pooled best" for name in judged],
               *[f"{_label(name)}'s choice / best on unread seeds" for name in s["unread"]]]
    n_sc = len(rep["rows"])
    second = ("-" if s["p_second"] is None else
              f"{s['p_second']:.2f} (over the {s['second_rows']} scenarios with at least {2 * k} seeds)")
    passes = "; ".join(f"the {_label(name)}'s choices pass in {ok} of {total}"
                       for name, (ok, total) in s["pooled"].items())
    lines = [tabulate(body, headers=headers, tablefmt="github", disable_numparse=True), "",
             f"Means over the scenarios, for one check of {k} seeds: the pooled best passes with probability "
             f"{s['p_best']:.2f} (in sample: optimistic), the best of the other seeds {s['p_held_out']:.2f}, the "
             f"best of a disjoint check {second}. Over the checks of {k} of the {s['shared']} seeds every scenario "
             f"shares, a perfect advisor passes at least {TARGET_SHARE:.0%} of the {n_sc} scenarios "
             f"({_need(n_sc, TARGET_SHARE)}) on {s['p_target_held_out']:.2f} of them (the best of the other seeds; "
             f"the pooled best: {s['p_target_pooled']:.2f}). Pooled judge (the verdict on the medians over every "
             f"seed): {passes or 'no check document'}." + "".join(
                 f" On the seeds no rule was chosen by (all but the check's) the {_label(name)}'s choices pass in "
                 f"{ok} of {total}." for name, (ok, total) in s["unread"].items())]
    if rep["skipped"]:
        lines.append(f"Left out (at most {k} complete seeds): " + ", ".join(
            f"{sc} ({len(seeds)})" for sc, seeds in rep["skipped"].items()) + ".")
    return "\n".join(lines)


def combined(reports):
    """One sentence over several world sizes' reports, their runs taken as independent.

    Args:
        reports: non-empty list of dicts from :func:`report`.

    Returns:
        str: the chance that a perfect advisor meets :data:`TARGET_SHARE` over all their scenarios on one check
        each (the pass-count distributions convolved), and the pooled judge's passes by kind of check.

    Raises:
        ValueError: ``reports`` is empty.
    """
    if not reports:
        raise ValueError("no report to combine")
    kinds, held, inside = {}, [1.0], [1.0]
    for rep in reports:
        held = convolve(held, rep["summary"]["dist_held_out"])
        inside = convolve(inside, rep["summary"]["dist_pooled"])
        for name, (ok, total) in rep["summary"]["pooled"].items():
            tally = kinds.setdefault(_label(name), [0, 0])
            tally[0] += ok
            tally[1] += total
    n_sc = len(held) - 1
    sizes = " and ".join(str(rep["np"]) for rep in reports)
    passes = "; ".join(f"the {kind}'s choices {ok} of {total}" for kind, (ok, total) in kinds.items())
    return (f"Over {sizes} ranks together ({n_sc} scenarios, world sizes independent): a perfect advisor passes at "
            f"least {TARGET_SHARE:.0%} ({_need(n_sc, TARGET_SHARE)}) with probability {at_least(held):.2f} (the best "
            f"of the other seeds; the pooled best: {at_least(inside):.2f}); pooled judge: "
            f"{passes or 'no check document'}.")


def update_docs(reports, docs_dir, command):
    """Write the generated block of ``docs_dir/simulator.md``: one table per world size, and with several the
    :func:`combined` sentence. Returns None.

    Args:
        reports: non-empty list of dicts from :func:`report`. docs_dir: str, the documentation folder (its
            ``simulator.md`` is rewritten). command: str, the command line to cite.

    Raises:
        FileNotFoundError: no ``simulator.md`` in ``docs_dir``. ValueError: only one of the markers is there.
    """
    parts = [f"Generated by `python -m hetsync.bench.advisor_noise {command}` from the runs the documents "
             "below record (nothing rerun). `P(...)`: shares of all subsets of the pooled seeds; a choice \"fails\" "
             "the verdict (10% of the best, the BSP rule) on the medians over every pooled seed.", ""]
    for rep in reports:
        parts += [f"**{rep['np']} ranks** ({', '.join(rep['documents'])})", "", table(rep), ""]
    if len(reports) > 1:
        parts.append(combined(reports))
    page = os.path.join(docs_dir, "simulator.md")
    with open(page) as f:
        text = f.read()
    with open(page, "w") as f:
        f.write(docpages.replace_block(text, BEGIN, END, "\n".join(parts).rstrip(),
                                       "### How much a check of three seeds resolves"))


def main(argv=None):
    """``python -m hetsync.bench.advisor_noise``: print the tables; with ``--update-docs`` write them.

    Args:
        argv: list of str (default ``sys.argv[1:]``).

    Returns:
        int exit status: 0, or 2 when a world size's documents are missing, unreadable or inconsistent, or have
        too few seeds (the message on standard error names which).

    Raises:
        SystemExit: bad arguments (argparse names the value).
    """
    p = argparse.ArgumentParser(prog="python -m hetsync.bench.advisor_noise", description=__doc__.splitlines()[0])
    p.add_argument("--docs-dir", default="docs", help="the documentation folder (its simulator/ documents)")
    p.add_argument("--np", type=int, nargs="+", default=[4, 8], help="world sizes (default 4 8)")
    p.add_argument("--k", type=int, default=3, help="seeds per check (default 3, as the advisor's check)")
    p.add_argument("--update-docs", action="store_true", help="write the tables into docs/simulator.md")
    args = p.parse_args(argv)
    if args.k < 1:
        p.error(f"--k {args.k}: a check needs at least one seed")
    if any(n < 1 for n in args.np):
        p.error(f"--np {' '.join(map(str, args.np))}: world sizes are at least 1")
    reports = []
    for n in args.np:
        try:
            reports.append(report(args.docs_dir, n, args.k))
        except (FileNotFoundError, ValueError) as exc:
            print(f"advisor_noise: {exc}", file=sys.stderr)
            return 2
        print(f"{n} ranks ({', '.join(reports[-1]['documents'])})\n{table(reports[-1])}\n")
    if len(reports) > 1:
        print(combined(reports))
    if args.update_docs:
        given = " ".join(sys.argv[1:] if argv is None else argv)
        update_docs(reports, args.docs_dir, given.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())

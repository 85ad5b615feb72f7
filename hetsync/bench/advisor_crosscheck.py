"""Where the advisor's misses come from: its check judged again with statistical efficiencies from elsewhere.

``python -m hetsync.bench.advisor_crosscheck CHECK.json CALIBRATION.json``

The advisor predicts a protocol's time to target relative to BSP as ``SE_p x S_p / S_BSP``
(:mod:`hetsync.sim.target`): the simulator's samples/s S and one statistical efficiency SE per protocol and world
size. This command separates the two. It reads an advisor check document (``docs/simulator/advisor_check*.json``:
per scenario the measured median time to target and samples to target over the check's seeds, and the advisor's
ranking with each protocol's predicted ``samples_per_s_vs_bsp``) and a calibration document of the same world size
and scenarios, measured on other seeds. Then, per scenario, it chooses with the same simulated throughputs, tie band
and order (:func:`hetsync.advise.predict.first_choice`) under four sources of SE, and judges each choice as the
check does (:func:`hetsync.bench.advisor_check.verdict`: within 10% of the measured best, never BSP where a protocol
was 1.5x faster):

* ``table``: the advisor's choice recorded in the check document (its table, :data:`hetsync.sim.target.TABLE`);
* ``same scenario``: the SE measured in the calibration document's run of the same scenario (what a table by
  scenario could give at best; BSP's samples to target over the protocol's, capped at 1);
* ``nearest other``: the SE of the calibration scenario whose predicted throughputs are nearest (Euclidean
  distance of the logarithms of every protocol's ``samples_per_s_vs_bsp``), the scenario itself left out: what a
  table by scenario kind gives a cluster it was not calibrated on;
* ``measured``: no simulator, the calibration's measured best median time to target in that scenario.

Nothing is trained; both documents come from ``python -m hetsync.bench.advisor_check``.
"""
import argparse
import json
import math
import sys

from tabulate import tabulate

from hetsync.advise.predict import first_choice
from hetsync.bench.advisor_check import verdict

__all__ = ["SOURCES", "scenario_se", "fingerprint", "nearest_other", "choices", "crosscheck", "main"]

#: the sources of statistical efficiency compared, in the table's column order.
SOURCES = ("table", "same scenario", "nearest other", "measured")


def _scenarios(doc):
    return {s["scenario"]: s for s in doc.get("scenarios", ())}


def scenario_se(scenario):
    """Statistical efficiency of each protocol in one scenario of a check document: BSP's samples to target over
    the protocol's (medians over the seeds), capped at 1 as :func:`hetsync.sim.target.lookup` caps it.

    Args:
        scenario: dict, one entry of a check document's ``scenarios`` (its ``samples``: protocol -> float samples).

    Returns:
        dict protocol -> float in (0, 1] (BSP 1.0; a protocol without samples to target is left out).

    Raises:
        ValueError: the scenario has no samples to target for BSP.
    """
    samples = scenario.get("samples") or {}
    ref = samples.get("bsp")
    if not ref:
        raise ValueError(f"scenario {scenario.get('scenario')!r} has no BSP samples to target")
    return {p: min(ref / v, 1.0) for p, v in samples.items() if v and math.isfinite(v)}


def fingerprint(scenario):
    """The scenario as the advisor sees it: log of each protocol's predicted samples/s over BSP's.

    Args:
        scenario: dict, one entry of a check document's ``scenarios`` (its ``ranking``).

    Returns:
        dict protocol -> float (natural logarithm of ``samples_per_s_vs_bsp``).
    """
    return {r["protocol"]: math.log(r["samples_per_s_vs_bsp"]) for r in scenario["ranking"]}


def nearest_other(name, scenario, calibration):
    """The calibration scenario nearest to ``scenario`` by :func:`fingerprint`, ``name`` itself left out.

    Args:
        name: str, the scenario's name. scenario: dict (a check document's scenario).
        calibration: dict name -> scenario of the calibration document.

    Returns:
        str, the nearest other scenario's name.

    Raises:
        ValueError: the calibration has no other scenario.
    """
    f = fingerprint(scenario)
    cands = []
    for other, s in calibration.items():
        if other == name:
            continue
        g = fingerprint(s)
        cands.append((sum((f[p] - g[p]) ** 2 for p in f if p in g), other))
    if not cands:
        raise ValueError(f"the calibration has no scenario other than {name!r}")
    return min(cands)[1]


def _choose(scenario, se):
    # a protocol the SE source did not measure (it never reached the target there) is predicted at 0: never chosen
    rows = [{"protocol": r["protocol"], "time_to_target_vs_bsp":
             r["samples_per_s_vs_bsp"] * (1.0 if r["protocol"] == "bsp" else se.get(r["protocol"], 0.0))}
            for r in scenario["ranking"]]
    return first_choice(rows)["protocol"]


def choices(name, scenario, calibration):
    """The first choice in one scenario under each source of :data:`SOURCES`.

    Args:
        name: str. scenario: dict (check document). calibration: dict name -> scenario (calibration document).

    Returns:
        dict source -> ``(protocol, note)``: str protocol and str note (the nearest scenario's name, or "").

    Raises:
        KeyError: ``name`` is not a calibration scenario.
    """
    cal = calibration[name]
    near = nearest_other(name, scenario, calibration)
    measured = {p: t for p, t in cal["medians"].items() if t is not None}
    return {"table": (scenario["choice"], ""),
            "same scenario": (_choose(scenario, scenario_se(cal)), ""),
            "nearest other": (_choose(scenario, scenario_se(calibration[near])), near),
            "measured": (min(measured, key=measured.get), "")}


def crosscheck(check, calibration):
    """Judge every scenario of ``check`` under every source of :data:`SOURCES`.

    Args:
        check, calibration: dicts, advisor check documents (the calibration's ``--calibration`` run) of the same
            world size; the calibration must hold every scenario of the check.

    Returns:
        ``(rows, passed)``: list of dicts (``scenario``, and per source ``choice``, ``note``, ``ratio``, ``ok``) and
        dict source -> int scenarios passed.

    Raises:
        ValueError: the documents' world sizes differ, or the calibration lacks a scenario of the check.
    """
    if check.get("np") != calibration.get("np"):
        raise ValueError(f"world sizes differ: check np={check.get('np')}, calibration np={calibration.get('np')}")
    cs, ks = _scenarios(check), _scenarios(calibration)
    missing = sorted(set(cs) - set(ks))
    if missing:
        raise ValueError(f"the calibration lacks scenario(s) {', '.join(missing)}; it has {', '.join(sorted(ks))}")
    rows, passed = [], {s: 0 for s in SOURCES}
    for name, s in cs.items():
        medians = {p: (math.inf if t is None else t) for p, t in s["medians"].items()}
        row = {"scenario": name}
        for source, (choice, note) in choices(name, s, ks).items():
            v = verdict(medians, choice)
            row[source] = {"choice": choice, "note": note, "ratio": v["ratio"], "ok": v["ok"]}
            passed[source] += int(v["ok"])
        rows.append(row)
    return rows, passed


def main(argv=None):
    """``python -m hetsync.bench.advisor_crosscheck CHECK.json CALIBRATION.json``: print the table.

    Args:
        argv: list of str (default ``sys.argv[1:]``).

    Returns:
        int exit status (0).

    Raises:
        SystemExit: a missing argument (argparse). FileNotFoundError: a missing document. ValueError: documents
            that do not match (:func:`crosscheck`).
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("check", help="an advisor check document (docs/simulator/advisor_check*.json)")
    p.add_argument("calibration", help="the calibration document of the same world size and scenarios")
    args = p.parse_args(argv)
    with open(args.check) as f:
        check = json.load(f)
    with open(args.calibration) as f:
        calibration = json.load(f)
    rows, passed = crosscheck(check, calibration)
    head = ["scenario"] + list(SOURCES)
    body = []
    for r in rows:
        cells = []
        for s in SOURCES:
            c = r[s]
            note = f" ({c['note']})" if c["note"] else ""
            cells.append(f"{c['choice']}{note} {c['ratio']:.2f}{'' if c['ok'] else ' (miss)'}")
        body.append([r["scenario"]] + cells)
    body.append(["passed"] + [f"{passed[s]} of {len(rows)}" for s in SOURCES])
    print(f"{check.get('np')} ranks, check seeds {check.get('seeds')}, calibration seeds {calibration.get('seeds')}; "
          "each cell: the choice and its median time to target over the measured best's")
    print(tabulate(body, headers=head, tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

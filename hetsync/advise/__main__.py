"""``python -m hetsync.advise``: which protocol for this cluster.

Two ways (``--help`` lists every option):

* ``python -m hetsync.advise --predict --scenario device:40+random:6 --np 8 [--hosts 4x2 --link 10gbit]
  [--batch-size B] [--step-ms MS] [--model-mb M] [--protocols a,b,...] [--json]``: predict from a scenario
  without a probe and without TensorFlow.
* ``horovodrun -np N python -m hetsync.advise [--model module:function] [--probe-s S] [--json]``: probe the
  cluster the launch runs on (at most 60 s), then predict from what was measured
  (:mod:`hetsync.advise.probe`).

Prints a ranked table of protocols (predicted samples/s and time to target relative to BSP, > 1 is
faster), the recommended configuration and the reasons; ``--json`` prints one JSON document on standard
output instead (``{"protocols": [...], "recommended": {...}, "inputs": {...}}``), logs on standard error.
"""
import argparse
import json
import sys

__all__ = ["main", "parser"]


def parser():
    """The command line (``argparse.ArgumentParser``)."""
    p = argparse.ArgumentParser(prog="python -m hetsync.advise", description=__doc__.splitlines()[0])
    p.add_argument("--predict", action="store_true", help="predict from --scenario without a probe (no TensorFlow)")
    p.add_argument("--scenario", default=None, help="slowdown spec of the cluster (--predict), e.g. device:40+random:6; "
                   "with the probe, each measured step is padded as the emulated cluster pads it")
    p.add_argument("--np", type=int, default=None, help="ranks that compute (--predict)")
    p.add_argument("--hosts", default=None, help="hosts as the cluster tool writes them: 4x2 or h0:2,h1:2 (default: one host)")
    p.add_argument("--link", default="10gbit", help="every host's link rate, tc units (10gbit)")
    p.add_argument("--host-link", action="append", default=[], metavar="HOST=RATE", help="one host's link rate")
    p.add_argument("--latency-ms", type=float, default=None, help="one-way latency between hosts (ms; default 0.025)")
    p.add_argument("--batch-size", type=int, default=None, help="per-rank batch size (samples; default 32)")
    p.add_argument("--step-ms", type=float, default=None, help="base step (ms) when the scenario has no device:MS")
    p.add_argument("--model-mb", type=float, default=None, help="gradient size in MB (default: the example MLP, 0.41)")
    p.add_argument("--host-ms", type=float, default=0.0, help="BSP's host work per step outside the device time "
                   "(ms; each protocol is simulated with its measured share of it)")
    p.add_argument("--samples-per-epoch", type=int, default=None, help="training samples per epoch (default: each "
                   "model's, MNIST's 60000)")
    p.add_argument("--epochs-to-target", type=float, default=None, help="epochs BSP needs to reach the target: "
                   "judge task allocation, which adapts after its first epoch, over that horizon (default: the "
                   "steady state)")
    p.add_argument("--servers", type=int, default=1, help="server ranks of the parameter-server protocols")
    p.add_argument("--protocols", default=None, help="comma-separated protocols to rank (default: those without servers)")
    p.add_argument("--steps", type=int, default=400, help="simulated steps per rank")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated step times")
    p.add_argument("--model", default=None, metavar="MODULE:FUNCTION",
                   help="probe: a function returning a compiled-ready Keras model (default: the example MLP)")
    p.add_argument("--probe-s", type=float, default=30.0, help="probe: seconds of training steps measured (<= 60)")
    p.add_argument("--timeout-s", type=float, default=None,
                   help="probe: end every rank after this many seconds (default --probe-s + 120)")
    p.add_argument("--json", action="store_true", help="print one JSON document on standard output")
    return p


def report(rows, rec, inputs_desc, as_json, out=sys.stdout):
    """Print the ranking and the recommendation (a table, or one JSON document with ``--json``).

    Args:
        rows: :func:`hetsync.advise.predict.predict`'s list. rec: :func:`hetsync.advise.predict.recommend`'s dict.
        inputs_desc: dict describing the inputs. as_json: bool. out: text stream.
    """
    from tabulate import tabulate

    from hetsync.advise import predict as _predict

    if as_json:
        json.dump({"protocols": rows, "recommended": rec, "inputs": inputs_desc}, out, indent=1, default=str)
        out.write("\n")
        return
    body, headers = _predict.rows_table(rows)
    out.write(tabulate(body, headers=headers) + "\n\n")
    out.write(f"Recommended: {rec['protocol']}" + (f" {rec['config']}" if rec["config"] else "") +
              f", {rec['time_to_target_vs_bsp']:.2f}x BSP's time-to-target speed\n")
    for r in rec["reasons"]:
        out.write(f"  - {r}\n")


def main(argv=None):
    """Run the advisor.

    Args:
        argv: list of str (default ``sys.argv[1:]``).

    Returns:
        int exit status: 0, or 2 for bad arguments (argparse's message names the value).

    Raises:
        SystemExit: bad arguments.
    """
    p = parser()
    args = p.parse_args(argv)
    from hetsync.advise import predict as _predict
    from hetsync.sim import registry

    protocols = (tuple(s.strip() for s in args.protocols.split(",") if s.strip()) if args.protocols
                 else _predict.DEFAULT_PROTOCOLS)
    for name in protocols:
        if name not in registry.MODELS:
            p.error(f"--protocols: no timing model for {name!r}; known: {', '.join(registry.names())}")
    if not 0 < args.probe_s <= 60:
        p.error(f"--probe-s must be in (0, 60] seconds, got {args.probe_s:g}")
    if args.predict:
        if args.scenario is None or args.np is None:
            p.error("--predict needs --scenario and --np")
        try:
            inputs = _predict.inputs_from_args(args.scenario, args.np, args.hosts, args.link, args.host_link,
                                               args.latency_ms, args.batch_size, args.step_ms, args.model_mb,
                                               args.host_ms, args.servers, args.steps, args.seed,
                                               args.samples_per_epoch, args.epochs_to_target)
        except ValueError as exc:
            p.error(str(exc))
        rows = _predict.predict(inputs, protocols)
        rec = _predict.recommend(rows, inputs)
        desc = {"scenario": args.scenario, "np": args.np, "hosts": args.hosts, "link": args.link,
                "network": inputs.net.describe(), "batch_size": inputs.work.batch_size,
                "model_bytes": inputs.work.model_bytes, "host_ms": inputs.work.host_ms}
        report(rows, rec, desc, args.json)
        return 0
    from hetsync.advise import probe

    return probe.main(args, protocols, p)


if __name__ == "__main__":
    sys.exit(main())

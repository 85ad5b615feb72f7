"""Sphinx directives that generate hetsync's documentation tables from the code and from measured results.

- ``protocol-arguments NAME``: the argument table of protocol ``NAME`` (its CLI name), from its
  configuration dataclass (:func:`hetsync.core.config.argument_rows`): a page cannot drift from the code.
- ``error-classes``: every class of :mod:`hetsync.errors` with its base classes and first docstring line.
- ``measured-choice``: the decision table "which protocol for which kind of heterogeneity", from the
  benchmark summaries that ``hetsync-bench --update-docs`` writes to ``docs/results/<preset>.json``
  (:mod:`hetsync.bench.docpages`).
- ``bench-runs``: each preset's last generated run (date, launches, duration, command), so the
  documented duration of ``make bench`` is the measured one.

In a Markdown page::

    ```{protocol-arguments} rna
    ```
"""
import os
import re

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

_CODE = re.compile(r"``(.+?)``|:[a-z:]+:`~?(.+?)`|`([^`]+?)`")


def _inline(text):
    """Paragraph of plain text and literals: ``x``, :role:`x` and `x` become code, the rest stays text."""
    para, pos = nodes.paragraph(), 0
    for m in _CODE.finditer(text):
        if m.start() > pos:
            para += nodes.Text(text[pos:m.start()])
        para += nodes.literal(text=next(g for g in m.groups() if g is not None))
        pos = m.end()
    if pos < len(text):
        para += nodes.Text(text[pos:])
    return para


def _table(header, rows, classes=()):
    """A docutils table: ``header`` a list of str, ``rows`` lists of str or nodes."""
    table = nodes.table(classes=list(classes))
    group = nodes.tgroup(cols=len(header))
    table += group
    for _ in header:
        group += nodes.colspec(colwidth=1)
    head = nodes.thead()
    group += head
    row = nodes.row()
    for h in header:
        row += nodes.entry("", nodes.paragraph(text=h))
    head += row
    body = nodes.tbody()
    group += body
    for cells in rows:
        row = nodes.row()
        for c in cells:
            entry = nodes.entry()
            entry += c if isinstance(c, nodes.Node) else _inline(str(c))
            row += entry
        body += row
    return table


class ProtocolArguments(SphinxDirective):
    """``protocol-arguments NAME``: the argument table of one protocol's configuration dataclass."""

    required_arguments = 1
    has_content = False

    def run(self):
        from hetsync import protocols
        from hetsync.core.config import argument_rows

        name = self.arguments[0]
        try:
            cls = protocols.get_config_class(name)
        except ValueError as exc:
            raise self.error(str(exc)) from None
        rows = []
        for r in argument_rows(cls):
            allowed = r["allowed"]
            if r["none"]:
                allowed = (allowed + "; " if allowed else "") + f"None: {r['none']}"
            rows.append([nodes.literal(text=r["name"]), r["type"], nodes.literal(text=r["default"]), allowed,
                         r["unit"], r["doc"]])
        intro = _inline(f"hetsync.protocols.get_wrapper(\"{name}\") takes these keyword arguments after the "
                        f"optimizer; on the command line each is --protocol-arg KEY=VALUE. Generated from "
                        f"{cls.__module__}.{cls.__name__}.")
        return [intro, _table(["argument", "type", "default", "allowed", "unit", "description"], rows,
                              classes=["hetsync-arguments"])]


class ErrorClasses(SphinxDirective):
    """``error-classes``: every exception class of :mod:`hetsync.errors`."""

    has_content = False

    def run(self):
        import hetsync.errors as errors

        rows = []
        for name in errors.__all__:
            obj = getattr(errors, name)
            if not isinstance(obj, type):
                continue
            bases = ", ".join(b.__name__ for b in obj.__bases__)
            first = (obj.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
            link = nodes.paragraph()
            link += nodes.reference("", name, refuri=f"#{name.lower()}")
            rows.append([link, bases, first])
        return [_table(["class", "derives from", "meaning"], rows)]


def _summaries(env):
    from hetsync.bench import docpages

    folder = os.path.join(env.srcdir, docpages.SUMMARY_DIR)
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        if name.endswith(".json"):
            env.note_dependency(os.path.join(folder, name))
    return docpages.load_summaries(folder)


class MeasuredChoice(SphinxDirective):
    """``measured-choice``: the best measured protocol per kind of heterogeneity, from the summaries."""

    has_content = False

    def run(self):
        from hetsync.bench import docpages

        rows = docpages.decision_rows(_summaries(self.env))
        if not rows:
            return [nodes.paragraph(text="No benchmark summary under docs/results/ yet: run "
                                         "hetsync-bench --update-docs.")]
        out = []
        for r in rows:
            link = nodes.paragraph()
            link += nodes.reference("", r["source"], refuri=r["link"])
            out.append([r["kind"], nodes.literal(text=r["protocol"]), r["time_ratio"], r["samples_ratio"],
                        r["runner_up"], r["where"], link])
        return [_table(["heterogeneity", "measured best", "time to target vs BSP", "samples to target vs BSP",
                        "runner-up", "measured on", "results"], out)]


class BenchRuns(SphinxDirective):
    """``bench-runs``: each preset's last generated run: date, launches (and how many were kept from earlier
    invocations by ``--resume``), minutes of the last invocation, command."""

    has_content = False

    def run(self):
        summaries = _summaries(self.env)
        if not summaries:
            return [nodes.paragraph(text="No benchmark summary under docs/results/ yet.")]
        # a resumed run's minutes are its last invocation's: say how many launches it kept from earlier ones
        rows = [[nodes.literal(text=s["preset"]), s["date_utc"],
                 str(s["launches"]) + (f" ({s['resumed']} kept from earlier invocations)" if s.get("resumed") else ""),
                 f"{s['wall_s'] / 60:.1f}", nodes.literal(text=s["command"])] for s in summaries]
        return [_table(["preset", "run on", "launches", "minutes", "command"], rows)]


def setup(app):
    """Register the directives (Sphinx extension entry point)."""
    app.add_directive("protocol-arguments", ProtocolArguments)
    app.add_directive("error-classes", ErrorClasses)
    app.add_directive("measured-choice", MeasuredChoice)
    app.add_directive("bench-runs", BenchRuns)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}

"""The documentation site: it builds in strict mode, and its generated parts cannot drift from the code.

The site is built once per session (Sphinx, ``-W``: a warning or a broken internal link fails), into a
temporary folder; the checks read the built HTML.
"""
import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")

bs4 = pytest.importorskip("bs4")  # furo's dependency: present wherever the site can be built


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", DOCS, str(out)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return out


def _soup(site, page):
    with open(os.path.join(site, page)) as f:
        return bs4.BeautifulSoup(f.read(), "html.parser")


def _protocols():
    from hetsync.protocols import REGISTRY

    return list(REGISTRY)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", _protocols())
def test_each_protocol_page_has_the_argument_table_of_its_configuration(site, name):
    from hetsync.protocols import get_config_class

    with open(os.path.join(DOCS, "protocols", f"{name}.md")) as f:
        source = f.read()
    assert f"```{{protocol-arguments}} {name}\n```" in source, f"docs/protocols/{name}.md lacks its argument table"
    table = _soup(site, f"protocols/{name}.html").find("table", class_="hetsync-arguments")
    assert table is not None
    header = [th.get_text(strip=True) for th in table.find("thead").find_all(["th", "td"])]
    assert header == ["argument", "type", "default", "allowed", "unit", "description"]
    rows = [[td.get_text(" ", strip=True) for td in tr.find_all("td")] for tr in table.find("tbody").find_all("tr")]
    fields = dataclasses.fields(get_config_class(name))
    assert [r[0] for r in rows] == [f.name for f in fields]
    assert [r[2] for r in rows] == [repr(f.default) for f in fields]
    for r, f in zip(rows, fields):
        if "ge" in f.metadata:
            assert f">= {f.metadata['ge']}" in r[3], (name, f.name, r[3])
        if "gt" in f.metadata:
            assert f"> {f.metadata['gt']}" in r[3], (name, f.name, r[3])


def test_every_error_class_has_a_troubleshooting_section(site):
    import hetsync.errors as errors

    soup = _soup(site, "troubleshooting.html")
    ids = {s.get("id") for s in soup.find_all("section")}
    classes = [n for n in errors.__all__ if isinstance(getattr(errors, n), type)]
    assert len(classes) >= 12
    missing = [n for n in classes if n.lower() not in ids]
    assert not missing, f"troubleshooting has no section for {missing}"


def test_every_page_of_docs_is_in_the_site_and_the_api_reference_renders(site):
    pages = [os.path.relpath(os.path.join(d, f), DOCS)[:-3] for d, _, fs in os.walk(DOCS) for f in fs
             if f.endswith(".md") and "_ext" not in d]
    missing = [p for p in pages if not os.path.exists(os.path.join(site, p + ".html"))]
    assert not missing, missing
    api = _soup(site, "api.html")
    documented = {dt.get("id") for dt in api.find_all("dt") if dt.get("id")}
    for name in ("hetsync.world.init", "hetsync.protocols.rna.protocol.RNA", "hetsync.callbacks.standard",
                 "hetsync.errors.NonFiniteError"):
        assert name in documented, name


def test_the_decision_table_and_the_bench_durations_come_from_the_recorded_runs(site):
    from hetsync.bench import docpages

    summaries = docpages.load_summaries(os.path.join(DOCS, docpages.SUMMARY_DIR))
    assert {s["preset"] for s in summaries} >= {"full", "cluster"}
    soup = _soup(site, "guide/choosing.html")
    tables = soup.find_all("table")
    assert len(tables) == 2
    text = tables[0].get_text(" ", strip=True)
    for row in docpages.decision_rows(summaries):
        assert row["kind"] in text and row["time_ratio"] in text
    runs = tables[1].get_text(" ", strip=True)
    for s in summaries:
        assert f"{s['wall_s'] / 60:.1f}" in runs and s["preset"] in runs
    # no hand-written duration of the benchmark left in the Makefile or the README
    for path in ("Makefile", "README.md"):
        with open(os.path.join(ROOT, path)) as f:
            assert not re.search(r"make bench\S*`?[^.\n]{0,40}\babout \d+ min", f.read()), path


def test_readme_is_short_and_links_into_the_site():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    assert len(text.splitlines()) <= 150
    assert text.count("```python") == 1
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert len(links) >= 8
    for link in links:
        assert os.path.exists(os.path.join(ROOT, link)), link
    with open(os.path.join(DOCS, "results", "cluster.json")) as f:
        cluster = json.load(f)
    from hetsync.bench import docpages

    block = text.split(docpages.HEADLINE_BEGIN, 1)[1].split(docpages.HEADLINE_END, 1)[0]
    assert block.strip() == docpages.headline_section(cluster).strip()


def test_the_protocol_index_names_every_protocol_with_its_default_data_plan():
    """The data plan column of the protocol index against the code: the config's ``data_plan`` default, the
    protocol's own plan where its class replaces ``fit_data`` (SelSync's SelDP, task allocation's shares),
    else the shared plans' default, a shard per rank."""
    from hetsync.core.dataplans import DataPlans
    from hetsync.protocols import REGISTRY, get_wrapper

    with open(os.path.join(DOCS, "protocols", "index.md")) as f:
        rows = {m.group(1): (m.group(2), m.group(3).strip()) for m in
                re.finditer(r"^\| \[`(\w+)`\]\(\w+\.md\) \| `hetsync\.(\w+)` \| ([^|]+) \|", f.read(), flags=re.M)}
    assert sorted(rows) == sorted(REGISTRY)
    for name in REGISTRY:
        wrapper, plan = rows[name]
        assert wrapper == REGISTRY[name][1], name
        proto = get_wrapper(name).protocol_class
        default = {f.name: f.default for f in dataclasses.fields(proto.Config)}.get("data_plan")
        owner = next(c for c in proto.__mro__ if "fit_data" in c.__dict__)
        if default is not None:
            assert plan == default, (name, plan, default)
        elif owner is DataPlans:
            assert plan == "shard", (name, plan)
        else:
            assert plan not in ("shard", "pool"), (name, plan, owner.__name__)

"""The documentation site in a real browser: built, served on localhost, opened in Debian's chromium through
its chromedriver (both installed by ``make deps``; nothing is downloaded at run time). Checks that the
navigation, the search and a protocol page render; saves a screenshot under runs/."""
import contextlib
import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading

import pytest

from conftest import ROOT

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# the flags this machine's closed network needs: no background connections, no first-run work
CHROME_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,900")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name) - no access log on stderr
        pass


@contextlib.contextmanager
def _serve(folder):
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextlib.contextmanager
def _browser(profile):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        driver.quit()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_site_navigation_search_and_a_protocol_page_render_in_chromium(tmp_path):
    for path in (CHROMIUM, CHROMEDRIVER):
        assert os.access(path, os.X_OK), f"{path} is missing: `make deps` installs Debian's chromium and chromium-driver"
    pytest.importorskip("selenium", reason="selenium is installed by make deps (requirements-dev.txt)")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           os.path.join(ROOT, "docs"), str(site)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    shots = os.path.join(ROOT, "runs")
    os.makedirs(shots, exist_ok=True)
    with _serve(site) as base, _browser(tmp_path / "profile") as driver:
        wait = WebDriverWait(driver, 60)
        # navigation: the sidebar lists the guide and every protocol page, and a link leads to its page
        driver.get(base + "/index.html")
        nav = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".sidebar-tree")))
        titles = [a.get_attribute("textContent").strip() for a in nav.find_elements(By.CSS_SELECTOR, "a.reference")]
        assert "Getting started" in titles and "Choosing a protocol" in titles, titles
        driver.get(base + "/guide/choosing.html")
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "article table")))
        assert "Choosing a protocol" in driver.title
        # search: the client-side index finds the RNA page for "initiator"
        driver.get(base + "/search.html?q=initiator")
        def hits(d):
            return [a.get_attribute("href").split("?")[0] for a in d.find_elements(By.CSS_SELECTOR, "ul.search li a")]

        # the results are appended as the index is searched: wait for the RNA page among them
        wait.until(lambda d: any(h.endswith("protocols/rna.html") for h in hits(d)))
        assert len(hits(driver)) >= 2
        # a protocol page: its generated argument table is there and visible
        driver.get(base + "/protocols/rna.html")
        table = wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, "table.hetsync-arguments")))
        first_cells = [r.find_elements(By.TAG_NAME, "td")[0].text for r in table.find_elements(By.CSS_SELECTOR,
                                                                                                 "tbody tr")]
        assert first_cells[:2] == ["probes", "max_staleness"], first_cells
        driver.execute_script("arguments[0].scrollIntoView();", table)
        assert driver.save_screenshot(os.path.join(shots, "docs-site-rna.png"))
    shutil.rmtree(tmp_path / "profile", ignore_errors=True)

"""The architecture's rules, checked: the import contracts (import-linter, pyproject.toml) and the TF-free parts."""
import os
import pkgutil
import subprocess
import sys

import hetsync

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_import_contracts_hold():
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    proc = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout and "BROKEN" not in proc.stdout


def test_a_broken_rule_is_reported(tmp_path):
    """The checker sees real imports: a contract forbidding core -> transport (which core uses) is broken."""
    config = tmp_path / "contracts.toml"
    config.write_text('[tool.importlinter]\nroot_package = "hetsync"\n\n[[tool.importlinter.contracts]]\n'
                      'name = "core without transport"\ntype = "forbidden"\nsource_modules = ["hetsync.core"]\n'
                      'forbidden_modules = ["hetsync.transport"]\n')
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    proc = subprocess.run([lint, "--no-cache", "--config", str(config)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode != 0 and "BROKEN" in proc.stdout, proc.stdout[-2000:]


def test_no_simulator_module_and_no_registry_lookup_loads_tensorflow():
    sim = [m.name for m in pkgutil.walk_packages(hetsync.sim.__path__, "hetsync.sim.")]
    code = ("import sys, importlib\n"
            f"mods = {sim!r} + ['hetsync', 'hetsync.protocols', 'hetsync.protocols.hop.graph', "
            "'hetsync.protocols.taskalloc.allocation', 'hetsync.emulation', 'hetsync.errors', 'hetsync.roles']\n"
            "for m in mods:\n    importlib.import_module(m)\n"
            "import hetsync.protocols as p\nnames = sorted(p.WRAPPERS)\n"
            "print(len(names), [m for m in ('tensorflow', 'keras', 'horovod') if m in sys.modules])\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[0] == "14 []", proc.stdout

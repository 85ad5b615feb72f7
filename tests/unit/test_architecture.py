"""The architecture's rules, checked: the import contracts (import-linter, pyproject.toml) and the TF-free parts."""
import ast
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


def _assignments(path):
    """Every ``X.attr = ...`` / ``X.attr += ...`` in a file: list of (line, name of X, attr)."""
    import ast

    tree = ast.parse(open(path).read())
    out = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(el, ast.Attribute) and isinstance(el.value, ast.Name):
                    out.append((node.lineno, el.value.id, el.attr))
                elif isinstance(el, ast.Attribute) and isinstance(el.value, ast.Attribute):
                    out.append((node.lineno, ast.unparse(el.value), el.attr))
    return out


#: the Keras model attributes hetsync sets, each one Keras itself has callbacks set (the architecture page,
#: rule 9): ``stop_training`` (ending fit), ``_initial_epoch`` (BackupAndRestore's resume, as Keras' own does),
#: ``train_function`` (ProtocolHooks wraps it once to raise a non-finite stop as NonFiniteError).
KERAS_MODEL_WRITES = {"stop_training", "_initial_epoch", "train_function"}


def test_no_module_writes_into_a_protocol_or_onto_the_keras_model():
    """Rule 9: a data plan returns a value (no data module assigns a protocol's attributes), and
    callbacks share run state through RunState, not ``model._hetsync_*`` attributes; on the Keras model
    only the attributes of :data:`KERAS_MODEL_WRITES` are set."""
    root = os.path.dirname(hetsync.__file__)
    bad = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)
            for line, owner, attr in _assignments(path):
                if attr.startswith("_hetsync_"):
                    bad.append(f"{rel}:{line}: {owner}.{attr} (a flag on a Keras object)")
                if owner in ("self.model", "model") and attr not in KERAS_MODEL_WRITES:
                    bad.append(f"{rel}:{line}: {owner}.{attr} (only Keras' own callback hooks may be set: "
                               f"{sorted(KERAS_MODEL_WRITES)})")
                if rel.startswith("data" + os.sep) and owner in ("protocol", "proto", "self.protocol"):
                    bad.append(f"{rel}:{line}: {owner}.{attr} (a data module writing into a protocol)")
    assert not bad, "\n".join(bad)


def test_protocols_define_no_keras_callback_the_hook_set_replaces_them():
    """Keras events reach a protocol through ProtocolHooks and the protocol's hook set only: no protocol
    module defines a ``keras.callbacks.Callback`` subclass or overrides ``callbacks()``."""
    import ast

    root = os.path.join(os.path.dirname(hetsync.__file__), "protocols")
    found = []
    for dirpath, _, files in os.walk(root):
        for f in (f for f in files if f.endswith(".py")):
            path = os.path.join(dirpath, f)
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.ClassDef) and any("Callback" in ast.unparse(b) for b in node.bases):
                    found.append(f"{os.path.relpath(path, root)}: class {node.name}")
                if isinstance(node, ast.FunctionDef) and node.name == "callbacks":
                    found.append(f"{os.path.relpath(path, root)}: def callbacks")
    assert not found, found


def test_channel_names_live_in_transport_channels_only():
    """Rule 10: every point-to-point channel name is spelled once, in hetsync.transport.channels."""
    import ast

    from hetsync.transport import channels

    assert len(set(channels.ALL)) == len(channels.ALL) and all(isinstance(c, str) for c in channels.ALL)
    assert {getattr(channels, n) for n in channels.__all__ if n != "ALL"} == set(channels.ALL)
    names = set(channels.ALL)
    root = os.path.dirname(hetsync.__file__)
    spelled = []
    for dirpath, _, files in os.walk(root):
        for f in (f for f in files if f.endswith(".py")):
            path = os.path.join(dirpath, f)
            if os.path.relpath(path, root) == os.path.join("transport", "channels.py"):
                continue
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.Constant) and node.value in names:
                    spelled.append(f"{os.path.relpath(path, root)}:{node.lineno}: {node.value!r}")
    assert not spelled, spelled


#: the dispatcher's methods that take a channel name: method -> (positions, keywords) of its channel argument(s)
_CHANNEL_ARGS = {"send": ((1,), ("channel",)), "tell": ((1,), ("channel",)), "flush": ((1,), ("channel",)),
                 "recv": ((0,), ("channel",)), "poll": ((0,), ("channel",)), "drain": ((0,), ("channel",)),
                 "route": ((0,), ("channel",)), "unroute": ((0,), ("channel",)), "wait": ((0,), ("channels",)),
                 "recv_or_fail": ((0, 4), ("channel", "fail_channel")),
                 "gather_at": ((2, 3), ("channel", "result_channel"))}


def _spelled_channels(source):
    """(line, method) of each call of a dispatcher channel method whose channel argument is spelled in place: a str
    literal, an f-string, or a list/tuple holding one."""
    def spelled(node):
        if isinstance(node, (ast.List, ast.Tuple)):
            return any(spelled(e) for e in node.elts)
        return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CHANNEL_ARGS:
            positions, keywords = _CHANNEL_ARGS[node.func.attr]
            args = [node.args[i] for i in positions if i < len(node.args)]
            args += [k.value for k in node.keywords if k.arg in keywords]
            if any(spelled(a) for a in args):
                found.append((node.lineno, node.func.attr))
    return found


def test_no_dispatcher_call_spells_a_channel_name():
    """Rule 10, for names not yet in the table: every channel argument of a dispatcher call is a name from
    hetsync.transport.channels, never a literal written at the call."""
    assert _spelled_channels("d.send(1, 'x.y', 2)\nd.recv(channel=f'x.{k}')\nd.wait(['a'], 1)\n"
                             "d.gather_at(0, [0], C.A, 'b', 1)\nd.send(1, C.A, 'payload')\nev.wait(0.5)") == \
        [(1, "send"), (2, "recv"), (3, "wait"), (4, "gather_at")]  # the scan sees literals, and only in a channel's place
    root = os.path.dirname(hetsync.__file__)
    spelled = []
    for dirpath, _, files in os.walk(root):
        for f in (f for f in files if f.endswith(".py")):
            path = os.path.join(dirpath, f)
            if os.path.relpath(path, root) != os.path.join("transport", "channels.py"):
                spelled += [f"{os.path.relpath(path, root)}:{n}: {m}" for n, m in _spelled_channels(open(path).read())]
    assert not spelled, spelled


def test_no_module_is_over_600_lines():
    # one algorithm or one mechanism per module: a module that outgrows this is split, not allowed to grow
    sizes = {}
    for dirpath, _, files in os.walk(os.path.join(ROOT, "hetsync")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                with open(path) as f:
                    sizes[os.path.relpath(path, ROOT)] = sum(1 for _ in f)
    assert len(sizes) > 50 and "hetsync/transport/p2p.py" in sizes
    assert {path: n for path, n in sizes.items() if n > 600} == {}

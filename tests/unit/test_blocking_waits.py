"""Every blocking wait in hetsync has a timeout and a clear error (no hang: a wait that cannot end raises a clear error).

A static inventory (``ast``) of hetsync/**/*.py lists every call of a blocking primitive: thread,
event and condition waits and joins, lock acquisitions with an argument list, queue gets and puts,
futures' results, the point-to-point dispatcher's recv / wait / flush / drain, the compiled ops
that block (Hop's update-queue dequeues and token takes, the gradient cache's wait), subprocess
runs and waits, any mpi4py blocking call, and polling loops (a ``while`` loop whose body waits or
sleeps). Each one must pass a timeout (keyword or positional) or, for a polling loop, check a
deadline (a clock read plus a ``raise``/``return``/``break``) -- unless it is in :data:`ALLOWLIST`
with the reason it cannot hang. ``pytest -s tests/unit/test_blocking_waits.py`` prints the inventory. A new blocking call without a
timeout fails :func:`test_every_blocking_call_has_a_timeout_or_an_allowlisted_reason`, naming every such call.

Not counted: ``with lock:`` critical sections (short, never held across a wait), and the horovod
collectives, which are bounded by horovod's stall shutdown (``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``,
set by :func:`hetsync.world.init`; checked here) and only called in ``hetsync/transport``.

The behaviour test of the dispatcher's creation timeout (a real 2-rank launch) is in
``tests/mp/test_dispatcher_timeout_mp.py``.
"""
import ast
import os
from conftest import ROOT
PKG = os.path.join(ROOT, "hetsync")
TIMEOUT_KW = {"timeout", "timeout_s", "timeout_ms"}
CLOCKS = {"monotonic", "time", "perf_counter"}
#: method name -> (positional index of the timeout argument, receiver filter or None). A call matches
#: when the filter (a function of the receiver's source text) is None or returns True.
_STRINGISH = ("os.path", "''", '""', "' '", "', '", "'; '", "'\\n'", "'+'", "'_'", "','", "os.pathsep", "sep")


def _not_string(receiver):
    return not (receiver.startswith(("'", '"', "f'", 'f"')) or receiver in _STRINGISH or receiver.endswith("path"))


def _is_dispatcher(receiver):
    return "p2p" in receiver or "dispatcher" in receiver or receiver == "d"


METHODS = {
    "join": (0, _not_string),  # Thread.join(timeout); str.join and os.path.join are filtered out
    "wait": (0, None),  # Event / Condition / Popen .wait(timeout); Dispatcher.wait(channels, timeout_s) below
    "wait_for": (1, None),  # Condition.wait_for(predicate, timeout)
    "acquire": (1, None),  # Lock.acquire(blocking, timeout)
    "put": (2, None),  # queue.Queue.put(item, block, timeout)
    "result": (0, None),  # concurrent.futures.Future.result(timeout)
    "exception": (0, None),
    "communicate": (1, None),  # Popen.communicate(input, timeout)
    "recv": (3, None),  # Dispatcher.recv(channel, source, tag, timeout_s)
    "flush": (0, _is_dispatcher),  # Dispatcher.flush(timeout_s, channel); file flushes are filtered out
    "drain": (2, _is_dispatcher),  # Dispatcher.drain(channel, peers, timeout_s)
}
#: ``get`` blocks only on a queue: ``dict.get(key)`` always has a positional argument, ``queue.get()`` none.
GET_BLOCKING = "get"
#: mpi4py blocking calls: no timeout exists, so every call must be allowlisted.
MPI_BLOCKING = {"Recv", "recv", "Probe", "probe", "Mprobe", "mprobe", "Wait", "Waitall", "Waitany", "Waitsome",
                "Barrier", "barrier", "Bcast", "bcast", "Allreduce", "allreduce", "Reduce", "Gather", "gather",
                "Allgather", "allgather", "Scatter", "Alltoall", "Sendrecv", "sendrecv", "Send", "Ssend", "ssend",
                "Dup", "Split", "Create", "Free"}
#: compiled blocking ops of hetsync.ops and the positional index of their ``timeout_ms``.
OPS = {"hop_update_queue_dequeue": 4, "hop_update_queue_dequeue_newest": 3, "hop_token_take": 3,
       "grad_cache_wait": 1, "grad_cache_wait_published": 2}
#: module-level functions that wait for a child process.
SUBPROCESS = {"run", "call", "check_call", "check_output"}
#: calls that make a ``while`` loop a polling loop.
LOOP_WAITS = {"sleep", "wait", "wait_for", "recv", "Test", "take", "dequeue"}  # poll/improbe never block
#: (file, enclosing function, call) -> why it cannot hang. The call is the callee's source text, or
#: "while" for a polling loop. Keep every entry commented with the reason.
ALLOWLIST = {
    # The receive thread's idle loop: it waits for nothing, it sleeps POLL_S between sweeps and ends
    # when shutdown() sets _stop; shutdown joins it with a timeout.
    ("hetsync/transport/p2p.py", "Dispatcher._receive_loop", "while"): "idle loop ended by shutdown (joined with "
                                                                       "a timeout)",
    # Freeing the dispatcher's communicator after its thread stopped: local, MPI_Comm_free does not wait for peers.
    ("hetsync/transport/p2p.py", "Dispatcher.shutdown", "self._comm.Free"): "MPI_Comm_free is local",
    # horovod's initialisation duplicates the MPI world inside horovod (collective) and has no timeout; a rank
    # that never gets there hangs the others until it exits (mpirun then ends the job). Known, not fixable here.
    ("hetsync/world.py", "init", "hvd.init"): "horovod's own collective initialisation, no timeout available",
    # RNA-H's heartbeat sender: a periodic send loop, not a wait for anything; ends when stop() sets the
    # event, then stop() joins it with a 5 s timeout.
    ("hetsync/protocols/rna/hierarchical.py", "HierarchicalRNAProtocol._heartbeat", "while"): "periodic sender ended by its "
                                                                                    "stop event (joined, 5 s)",
}


def _qualname(stack):
    return ".".join(n.name for n in stack if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))


def _has_timeout(call, index):
    name = _callee(call)[0]
    at = 1 if name == "put" else 0  # position of blocking/block
    nonblocking = [k.value for k in call.keywords if k.arg in ("blocking", "block")] + call.args[at:at + 1]
    if name in ("acquire", "get", "put") and any(
            isinstance(v, ast.Constant) and v.value is False for v in nonblocking):
        return True  # lock.acquire(False), queue.get(block=False): never waits
    if any(k.arg in TIMEOUT_KW for k in call.keywords if k.arg):
        return True
    if any(k.arg is None for k in call.keywords):  # **kwargs: cannot tell, counted as passing it
        return True
    return len(call.args) > index


def _walk(node, stack):
    """Yield (node, stack of enclosing defs) for every node, not descending into nested defs' stacks wrongly."""
    for child in ast.iter_child_nodes(node):
        inner = stack + [child] if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else stack
        yield child, inner
        yield from _walk(child, inner)


def _loop_nodes(loop):
    """Nodes of a ``while`` loop (test and body), not entering nested function definitions."""
    todo = [loop.test] + list(loop.body)
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(n))


def _callee(call):
    f = call.func
    if isinstance(f, ast.Attribute):
        return f.attr, ast.unparse(f.value)
    if isinstance(f, ast.Name):
        return f.id, ""
    return None, None


def _loop_entry(loop):
    """(waits, has_deadline) of a ``while`` loop."""
    waits, clock, exits = [], False, False
    for n in _loop_nodes(loop):
        if isinstance(n, ast.Call):
            name, receiver = _callee(n)
            if name in LOOP_WAITS:
                waits.append(name)
            if name in CLOCKS and receiver == "time":
                clock = True
        if isinstance(n, ast.Name) and ("deadline" in n.id or n.id in ("remaining", "late", "idle")):
            clock = True
        if isinstance(n, (ast.Raise, ast.Return, ast.Break)):
            exits = True
    return waits, clock and exits


def inventory():
    """Every blocking call in hetsync: list of dicts ``file, line, func, call, kind, ok``."""
    items = []
    for folder, _, files in os.walk(PKG):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, ROOT)
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            for node, stack in _walk(tree, []):
                func = _qualname(stack) or "<module>"
                if isinstance(node, ast.While):
                    waits, deadline = _loop_entry(node)
                    if waits:
                        items.append({"file": rel, "line": node.lineno, "func": func, "call": "while",
                                      "kind": "polling loop (" + ",".join(sorted(set(waits))) + ")", "ok": deadline})
                    continue
                if not isinstance(node, ast.Call):
                    continue
                attr, receiver = _callee(node)
                if attr is None:
                    continue
                text = ast.unparse(node.func)
                kind = ok = None
                is_method = isinstance(node.func, ast.Attribute)
                if attr in OPS and (not is_method or receiver == "ops"):
                    kind, ok = "compiled op", _has_timeout(node, OPS[attr])
                elif is_method and receiver == "subprocess" and attr in SUBPROCESS:
                    kind, ok = "subprocess", _has_timeout(node, 99)
                elif is_method and attr == "wait" and _is_dispatcher(receiver):
                    kind, ok = "dispatcher", _has_timeout(node, 1)
                elif is_method and attr in METHODS and (METHODS[attr][1] is None or METHODS[attr][1](receiver)):
                    kind, ok = "wait", _has_timeout(node, METHODS[attr][0])
                elif is_method and attr == GET_BLOCKING and not node.args:
                    kind, ok = "queue get", _has_timeout(node, 1)
                elif is_method and attr == "init" and receiver == "hvd":
                    kind, ok = "horovod init", False  # collective, no timeout exists: allowlisted
                elif is_method and attr in MPI_BLOCKING and ("comm" in receiver or "MPI" in receiver
                                                             or "message" in receiver or "request" in receiver):
                    kind, ok = "mpi", False  # no timeout exists: allowlist with the reason
                if kind is not None:
                    items.append({"file": rel, "line": node.lineno, "func": func, "call": text, "kind": kind,
                                  "ok": ok})
    return sorted(items, key=lambda i: (i["file"], i["line"]))


INVENTORY = inventory()


def _missing(inventory_, allowlist):
    """The inventory items without a timeout and without an allowlisted reason."""
    return [i for i in inventory_ if not i["ok"] and (i["file"], i["func"], i["call"]) not in allowlist]


def test_every_blocking_call_has_a_timeout_or_an_allowlisted_reason():
    """One test over the whole inventory: every timeout-less blocking call is listed (file, line, call) in one
    failure message, not one case per call."""
    missing = _missing(INVENTORY, ALLOWLIST)
    assert not missing, (
        "blocking calls without a timeout (pass timeout/timeout_s/timeout_ms, or give a polling loop a deadline "
        "that raises a clear error naming the rank, the peer or channel and the timeout; or allowlist it with "
        "the reason it cannot hang):\n" + "\n".join(
            f"  {i['file']}:{i['line']} in {i['func']}: {i['kind']} {i['call']!r}" for i in missing))


def test_inventory_is_complete_and_allowlist_is_current():
    print("\nblocking waits in hetsync:")
    for i in INVENTORY:
        note = "timeout" if i["ok"] else "ALLOWLIST: " + ALLOWLIST.get((i["file"], i["func"], i["call"]), "MISSING")
        print(f"  {i['file']}:{i['line']} {i['func']}: {i['call']} [{i['kind']}] -> {note}")
    keys = {(i["file"], i["func"], i["call"]) for i in INVENTORY if not i["ok"]}
    stale = sorted(set(ALLOWLIST) - keys)
    assert not stale, f"allowlist entries that match no timeout-less call any more (remove them): {stale}"
    kinds = {i["kind"].split(" (")[0] for i in INVENTORY}
    # the inventory really sees the package's waits (a broken matcher would pass vacuously)
    assert {"compiled op", "dispatcher", "wait", "polling loop", "mpi", "horovod init"} <= kinds, kinds
    calls = {(i["file"], i["call"]) for i in INVENTORY}
    for expected in [("hetsync/protocols/hop/protocol.py", "ops.hop_token_take"),
                     ("hetsync/protocols/rna/protocol.py", "self._thread.join"),
                     ("hetsync/protocols/taskalloc/data.py", "self._plan_cv.wait_for"),
                     ("hetsync/transport/p2p.py", "while"),
                     ("hetsync/transport/p2p.py", "self.recv"),
                     ("hetsync/bench/launch.py", "proc.communicate")]:
        assert expected in calls, f"{expected} missing from the inventory"


def _fake_module(src):
    tree = ast.parse(src)
    found = []
    for node, stack in _walk(tree, []):
        if isinstance(node, ast.While):
            found.append(("while", _loop_entry(node)[1]))
        elif isinstance(node, ast.Call):
            attr, receiver = _callee(node)
            if attr in METHODS and (METHODS[attr][1] is None or METHODS[attr][1](receiver)):
                found.append((ast.unparse(node.func), _has_timeout(node, METHODS[attr][0])))
    return found


def test_the_matcher_flags_waits_without_timeouts():
    src = """
def f(t, ev, q, p2p, fut, lock):
    t.join()
    ev.wait()
    p2p.recv("ch", source=1)
    fut.result()
    lock.acquire()
    lock.acquire(blocking=False)
    ", ".join(["a"])
    t.join(5.0)
    p2p.recv("ch", timeout_s=3)
    while True:
        time.sleep(0.1)
"""
    assert _fake_module(src) == [("t.join", False), ("ev.wait", False), ("p2p.recv", False), ("fut.result", False),
                                 ("lock.acquire", False), ("lock.acquire", True), ("t.join", True), ("p2p.recv", True), ("while", False)]


def test_a_new_timeout_less_call_is_reported_and_an_allowlisted_one_is_not():
    new = {"file": "hetsync/x.py", "line": 3, "func": "f", "call": "t.join", "kind": "wait", "ok": False}
    allowed = {"file": "hetsync/x.py", "line": 4, "func": "g", "call": "t.join", "kind": "wait", "ok": False}
    timed = {"file": "hetsync/x.py", "line": 5, "func": "f", "call": "ev.wait", "kind": "wait", "ok": True}
    assert _missing([new, allowed, timed], {("hetsync/x.py", "g", "t.join"): "why"}) == [new]


def test_horovod_collectives_are_bounded_by_the_stall_shutdown():
    """Collectives have no per-call timeout: world.init sets horovod's stall shutdown, and only
    hetsync/transport calls horovod's collectives (so the bound covers every one of them)."""
    with open(os.path.join(PKG, "world.py")) as f:
        tree = ast.parse(f.read())
    sets = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "os.environ.setdefault"
            and n.args and isinstance(n.args[0], ast.Constant)]
    assert {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_STALL_CHECK_TIME_SECONDS"} <= {n.args[0].value
                                                                                         for n in sets}
    collectives = {"allreduce", "grouped_allreduce", "allgather", "allgather_object", "broadcast",
                   "broadcast_object", "alltoall", "barrier", "join", "reducescatter"}
    outside = []
    for folder, _, files in os.walk(PKG):
        for name in files:
            if not name.endswith(".py") or os.path.join(folder, name).startswith(os.path.join(PKG, "transport")):
                continue
            with open(os.path.join(folder, name)) as f:
                tree = ast.parse(f.read())
            outside += [f"{name}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Call)
                        and isinstance(n.func, ast.Attribute) and n.func.attr in collectives
                        and ast.unparse(n.func.value) in ("hvd", "horovod.tensorflow")]
    assert not outside, f"horovod collectives called outside hetsync/transport: {outside}"

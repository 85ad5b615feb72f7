"""Point-to-point messages: one dispatcher per process, named channels, a timeout on every wait.

RNA's controller, SelSync's data injection, Hop's update and token queues, the parameter servers and
the sample pool all go through one :class:`Dispatcher` per process (mpi4py with ``MPI_THREAD_MULTIPLE``
shares the MPI world with horovod; a background thread may send and receive on a duplicated
communicator while the main thread trains with horovod's collectives):

* its own communicator, ``MPI.COMM_WORLD.Dup()``, so its messages never match horovod's or a user's;
  :func:`hetsync.transport.endpoint.dispatcher` (re-exported here) creates it at its first call (collective);
* one receive thread that takes every incoming message (matched probe, then receive) into its channel's
  queue, polling every :data:`POLL_S` seconds (OpenMPI's blocking receives spin a core);
* :meth:`Dispatcher.send` (a non-blocking ``isend``, tracked; optionally waited for) and :meth:`Dispatcher.recv`
  (waits for a message by channel, source and/or tag), with timeouts (times the run's dilation D,
  :func:`hetsync.world.dilation`) whose :class:`TransportTimeout` names the rank, peer and channel;
  :meth:`Dispatcher.recv_or_fail` (a reply, unless the peer reports its failure first) and
  :meth:`Dispatcher.gather_at` (an allgather by messages through one rank) build on them;
* :meth:`Dispatcher.drain` ends a channel's traffic exactly: every rank sends an end marker to every peer, waits
  for every peer's marker and discards, counting them, the messages it never read (MPI's non-overtaking rule);
* :meth:`Dispatcher.shutdown` waits for outstanding sends (counting those that do not complete), joins the
  thread, counts unread messages and frees the communicator.

Every channel name is in :mod:`hetsync.transport.channels`. Every message sent, received, read, discarded or
left undelivered is counted per channel (:meth:`Dispatcher.stats`): nothing is dropped silently.
"""
import collections
import logging
import numbers
import threading
import time

from hetsync import world
from hetsync.errors import TransportError, TransportTimeout
from hetsync.transport.endpoint import CREATE_TIMEOUT_S, dispatcher, shutdown
from hetsync.transport.messages import (  # noqa: F401 - re-exported: the dispatcher's message types and constants
    _END, COUNTERS, DEFAULT_TIMEOUT_S, MPI_TAG, POLL_S, RECEIVE_TIMEOUT_S, WAIT_SLICE_S, Message, _End, _Send,
    _tag_text, _who)

__all__ = ["Dispatcher", "Message", "TransportTimeout", "TransportError", "dispatcher", "shutdown", "POLL_S",
           "DEFAULT_TIMEOUT_S", "CREATE_TIMEOUT_S", "MPI_TAG", "COUNTERS", "WAIT_SLICE_S"]

log = logging.getLogger("hetsync")


class Dispatcher:
    """This process's point-to-point endpoint: a receive thread routing messages to named channels.

    Obtain it with :func:`dispatcher` (never construct one yourself: the communicator must be a
    collective ``Dup`` made by every rank). Thread-safe: any thread may send, receive, drain.

    Args:
        comm: an mpi4py intracommunicator owned by the dispatcher (freed by :meth:`shutdown`).
        poll_s: float seconds the receive thread sleeps when nothing arrived (> 0).

    Attributes:
        rank, size: this process's rank and the world size on ``comm`` (ints).
    """

    def __init__(self, comm, poll_s=POLL_S):
        from mpi4py import MPI

        if not poll_s > 0:
            raise ValueError(f"Dispatcher: poll_s must be a positive number of seconds, got {poll_s!r}")
        self._MPI = MPI
        self._comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.poll_s = float(poll_s)
        self._cv = threading.Condition()
        self._queues = collections.defaultdict(collections.deque)
        self._routes = {}
        self._sends = []
        self._counts = collections.defaultdict(lambda: dict.fromkeys(COUNTERS, 0))
        self._error, self._closed, self._report = None, False, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive_loop, name=f"hetsync-p2p-{self.rank}", daemon=True)
        self._thread.start()

    # -- the receive thread ------------------------------------------------------------------------
    def _receive_loop(self):
        status = self._MPI.Status()
        try:
            while True:
                got = self._receive_available(status)
                self._reap_sends()
                if self._stop.is_set():
                    self._receive_available(status)  # last sweep: what arrived is queued and counted
                    return
                if not got:
                    time.sleep(self.poll_s)  # cheaper than Event.wait; shutdown waits at most poll_s
        except BaseException as exc:  # noqa: BLE001 - reported to every waiter and caller
            with self._cv:
                self._error = f"rank {self.rank}: the point-to-point receive thread failed: {exc!r}"
                self._cv.notify_all()
            log.error("hetsync %s", self._error)

    def _receive_available(self, status):
        got = 0
        while True:
            message = self._comm.improbe(source=self._MPI.ANY_SOURCE, tag=MPI_TAG, status=status)
            if message is None:
                return got
            source = status.Get_source()
            channel, tag, obj = self._receive_matched(message)
            with self._cv:  # the route is looked up under the lock, so route() never misses a message
                handler = None if isinstance(obj, _End) else self._routes.get(channel)
                if handler is not None:
                    self._counts[channel].update(received=self._counts[channel]["received"] + 1,
                                                 read=self._counts[channel]["read"] + 1)
            if handler is not None:
                handler(Message(source, channel, tag, obj))  # an exception fails the thread, seen by every waiter
                got += 1
                continue
            with self._cv:
                self._queues[channel].append(Message(source, channel, tag, obj))
                if not isinstance(obj, _End):
                    self._counts[channel]["received"] += 1
                self._cv.notify_all()
            got += 1

    def _receive_matched(self, message):
        """A matched message's object, by ``irecv`` tested every ``poll_s`` (a blocking receive of a large message
        on a slow link held this rank's own sends inside MPI). Raises TransportError after
        :data:`RECEIVE_TIMEOUT_S` x D (its sender died mid-message); the thread fails, every waiter sees it."""
        request = message.irecv()
        limit_s = world.dilated(RECEIVE_TIMEOUT_S)
        deadline = time.monotonic() + limit_s
        while True:
            done, obj = request.test()
            if done:
                return obj
            if time.monotonic() > deadline:
                raise TransportError(f"rank {self.rank}: a matched point-to-point message was still incomplete after "
                                     f"{limit_s:g} s (its sender died or stalled in the middle of it)")
            self._reap_sends()
            time.sleep(self.poll_s)

    def _reap_sends(self):
        if not self._sends:  # unlocked peek: a send appended meanwhile is reaped next time
            return
        with self._cv:
            before = len(self._sends)
            self._sends = [s for s in self._sends if not s.request.Test()]
            if len(self._sends) != before:
                self._cv.notify_all()

    # -- checks -------------------------------------------------------------------------------------
    def _check_usable(self):
        if self._error is not None:
            raise TransportError(self._error)
        if self._closed:
            raise TransportError(f"rank {self.rank}: the point-to-point dispatcher was shut down")

    def _check_peer(self, peer, what):
        if isinstance(peer, bool) or not isinstance(peer, numbers.Integral) or not 0 <= peer < self.size:
            raise ValueError(f"{what} must be a rank in [0, {self.size}), got {peer!r}")
        return int(peer)

    @staticmethod
    def _check_channel(channel):
        if not isinstance(channel, str) or not channel:
            raise ValueError(f"channel must be a non-empty str, got {channel!r}")

    @staticmethod
    def _check_timeout(timeout_s):  # returns it as wall seconds of this run (times the dilation D)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s >= 0:
            raise ValueError(f"timeout_s must be a number of seconds >= 0, got {timeout_s!r}")
        return world.dilated(timeout_s)

    # -- routing ------------------------------------------------------------------------------------
    def route(self, channel, handler):
        """Hand every message of ``channel`` to ``handler`` on the receive thread instead of queueing it.

        Used where a compiled queue is the receiver (Hop's update and token queues: the handler
        enqueues into the op's resource, so the training step's blocking dequeue sees the message
        without any Python thread in between). Messages of the channel already queued are handed
        over first, in arrival order. End markers (:meth:`drain`) are still queued, so a routed
        channel drains like any other. A handler that raises fails the receive thread: every
        waiter and caller then gets :class:`TransportError` naming the exception. Routed messages
        count as ``received`` and ``read``.

        Args:
            channel: str. handler: callable ``(Message) -> None``, quick and thread-safe.

        Raises:
            ValueError: bad channel, a handler that is not callable, or the channel already routed.
        """
        self._check_channel(channel)
        if not callable(handler):
            raise ValueError(f"route: handler for channel {channel!r} must be callable, got {handler!r}")
        with self._cv:
            if channel in self._routes:
                raise ValueError(f"route: channel {channel!r} is already routed; unroute it first")
            queue = self._queues.get(channel, collections.deque())
            backlog = [m for m in queue if not isinstance(m.obj, _End)]
            self._queues[channel] = collections.deque(m for m in queue if isinstance(m.obj, _End))
            self._counts[channel]["read"] += len(backlog)
            for m in backlog:
                handler(m)
            self._routes[channel] = handler

    def unroute(self, channel):
        """Queue ``channel``'s messages again (undo :meth:`route`; a no-op if it was not routed)."""
        with self._cv:
            self._routes.pop(channel, None)

    # -- sending ------------------------------------------------------------------------------------
    def send(self, dest, channel, obj, tag=None, timeout_s=None):
        """Send ``obj`` to rank ``dest`` on ``channel`` (non-blocking ``isend`` of the pickled object).

        Args:
            dest: int rank in [0, size) (may be this rank).
            channel: str, the channel name. obj: any picklable object.
            tag: optional picklable value the receiver can select on (e.g. an iteration number).
            timeout_s: None (default: return at once; the send is tracked and waited for by
                :meth:`flush` / :meth:`shutdown`) or float seconds >= 0 to wait for this send to
                complete (its data handed to MPI's buffers or received).

        Raises:
            ValueError: bad dest, channel or timeout.
            TransportTimeout: ``timeout_s`` given and the send did not complete in time (names
                the peer and channel).
            TransportError: the dispatcher failed or was shut down.
        """
        dest = self._check_peer(dest, "send: dest")
        self._check_channel(channel)
        if timeout_s is not None:
            timeout_s = self._check_timeout(timeout_s)
        with self._cv:
            self._check_usable()
        request = self._comm.isend((channel, tag, obj), dest=dest, tag=MPI_TAG)
        entry = _Send(request, dest, channel, tag, isinstance(obj, _End))
        with self._cv:
            self._sends.append(entry)
            if not entry.marker:
                self._counts[channel]["sent"] += 1
        if timeout_s is not None:
            self._wait_sends(lambda s: s is entry, timeout_s, f"a message to rank {dest} on channel {channel!r}")

    def _wait_sends(self, select, timeout_s, what):
        deadline = time.monotonic() + timeout_s
        while True:
            with self._cv:
                self._sends = [s for s in self._sends if not s.request.Test()]
                pending = [s for s in self._sends if select(s)]
                if not pending:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    peers = sorted({(s.dest, s.channel) for s in pending})
                    raise TransportTimeout(
                        f"rank {self.rank}: {len(pending)} send(s) of {what} not completed within {timeout_s:g} s "
                        f"(to " + ", ".join(f"rank {d} on channel {c!r}" for d, c in peers) + ")",
                        pending=[(s.dest, s.channel, s.tag) for s in pending])
                self._cv.wait(min(remaining, 0.01))

    def flush(self, timeout_s=DEFAULT_TIMEOUT_S, channel=None):
        """Wait until every outstanding send (of ``channel``, or of all channels) has completed.

        Args:
            timeout_s: float seconds >= 0. channel: None (all) or a channel name.

        Raises:
            TransportTimeout: sends still outstanding after ``timeout_s``; the message names their
                peers and channels, ``pending`` lists them.
        """
        what = "any channel" if channel is None else f"channel {channel!r}"
        self._wait_sends(lambda s: channel is None or s.channel == channel, self._check_timeout(timeout_s), what)

    def tell(self, dests, channel, obj, timeout_s=5.0):
        """Best-effort send of ``obj`` to every rank of ``dests`` on ``channel``, for use while another
        error is being raised (a server telling its clients why it stops).

        Never raises: a send that fails or does not complete within ``timeout_s`` is left, and its
        rank is returned, so the caller's own error stays the one reported.

        Args:
            dests: iterable of int ranks. channel: str. obj: any picklable object.
            timeout_s: float seconds >= 0 to wait for the sends of ``channel`` to complete.

        Returns:
            list of int: the ranks that may not have been told (the send failed, or sends of
            ``channel`` were still outstanding after ``timeout_s``; then every rank of ``dests``).
        """
        dests, failed = list(dests), []
        for r in dests:
            try:
                self.send(r, channel, obj)
            except Exception:  # noqa: BLE001 - the caller's error is the one to report
                failed.append(r)
        try:
            self.flush(timeout_s=timeout_s, channel=channel)
        except Exception:  # noqa: BLE001
            return dests
        return failed

    # -- receiving ----------------------------------------------------------------------------------
    def _pop(self, channel, source, tag):
        queue = self._queues.get(channel)
        if not queue:
            return None
        for i, m in enumerate(queue):
            if isinstance(m.obj, _End):
                continue
            if (source is None or m.source == source) and (tag is None or m.tag == tag):
                del queue[i]
                self._counts[channel]["read"] += 1
                return m
        return None

    def poll(self, channel, source=None, tag=None):
        """Return the oldest queued :class:`Message` on ``channel`` matching ``source`` and ``tag``
        (None matches any), or None at once if there is none. Raises TransportError if the
        dispatcher failed."""
        self._check_channel(channel)
        with self._cv:
            message = self._pop(channel, source, tag)
            if message is None and self._error is not None:
                raise TransportError(self._error)
            return message

    def recv(self, channel, source=None, tag=None, timeout_s=DEFAULT_TIMEOUT_S):
        """Wait for the oldest message on ``channel`` from ``source`` with ``tag`` (None: any).

        Args:
            channel: str. source: None or an int rank. tag: None or the sender's tag.
            timeout_s: float seconds >= 0.

        Returns:
            :class:`Message` ``(source, channel, tag, obj)``.

        Raises:
            TransportTimeout: nothing matching arrived within ``timeout_s`` (names this rank, the
                awaited peer, the channel and the tag).
            TransportError: the dispatcher failed or was shut down while waiting.
            ValueError: bad channel, source or timeout.
        """
        self._check_channel(channel)
        if source is not None:
            source = self._check_peer(source, "recv: source")
        return self._recv(channel, source, tag, self._check_timeout(timeout_s))

    def _recv(self, channel, source, tag, timeout_s):
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while True:
                message = self._pop(channel, source, tag)
                if message is not None:
                    return message
                self._check_usable()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TransportTimeout(
                        f"rank {self.rank}: timed out after {timeout_s:g} s waiting for a message on channel "
                        f"{channel!r} from {_who(source)}{_tag_text(tag)}",
                        pending=[(source, channel, tag)])
                self._cv.wait(remaining)

    def recv_or_fail(self, channel, source, tag=None, timeout_s=DEFAULT_TIMEOUT_S, fail_channel=None,
                     error=TransportTimeout, late=None, failed=None, check=None):
        """Wait for one message from ``source``, unless a failure report or the deadline comes first.

        Returns the oldest message on ``channel`` from ``source`` with ``tag``; a message on ``fail_channel``
        (a peer's failure report, e.g. a parameter server's on :data:`channels.PS_ERROR`) or the deadline raises.

        Args:
            channel: str. source: int rank. tag: None or the sender's tag. timeout_s: float seconds >= 0 in all.
            fail_channel: str or None, a channel whose any message means the peer failed.
            error: exception class to raise (a :class:`hetsync.errors.HetsyncError` subclass).
            late: str, the timeout error's message, to which the channel and tag are added (default: names
                this rank, the peer, the channel, the tag and the seconds waited).
            failed: callable ``(source rank, report object) -> str``, the message of a failure report
                (default: "rank R failed: REPORT").
            check: callable ``() -> None`` called every ``WAIT_SLICE_S`` seconds at most; what it raises ends the wait.

        Returns:
            the message's object (not the :class:`Message`).

        Raises:
            error: a failure report arrived, or nothing within ``timeout_s`` (a :class:`TransportTimeout`
                also lists ``(source, channel, tag)`` in ``pending``).
            Exception: whatever ``check`` raises.
            TransportError: the dispatcher failed or was shut down while waiting.
        """
        timeout_s = self._check_timeout(timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            message = self.poll(channel, source=source, tag=tag)
            if message is not None:
                return message.obj
            report = self.poll(fail_channel) if fail_channel is not None else None
            if report is not None:
                text = failed(report.source, report.obj) if failed else f"rank {report.source} failed: {report.obj}"
                raise error(f"rank {self.rank}: {text}" if failed is None else text)
            if check is not None:
                check()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                where = f"channel {channel!r} from {_who(source)}{_tag_text(tag)}"
                text = (f"{late} ({where})" if late else
                        f"rank {self.rank}: nothing on {where} within {timeout_s:g} s (the peer is dead or stalled)")
                raise error(text, pending=[(source, channel, tag)]) if issubclass(error, TransportTimeout) \
                    else error(text)
            try:
                return self._recv(channel, source, tag, min(WAIT_SLICE_S, remaining)).obj
            except TransportTimeout:
                continue

    def gather_at(self, root, ranks, channel, result_channel, value, tag=None, timeout_s=DEFAULT_TIMEOUT_S):
        """An allgather over ``ranks`` by messages through ``root`` (every rank in ``ranks`` calls it): usable
        while another thread runs horovod collectives, and over the workers only when some ranks serve.

        Args:
            root: int rank in ``ranks`` that collects. ranks: list of int ranks, in the order of the result.
            channel: str, the channel of the values sent to ``root``. result_channel: str, of the
                list sent back. value: any picklable object. tag: None or a tag that tells one gather
                from the next (e.g. the epoch). timeout_s: float seconds each wait may take.

        Returns:
            list of the ranks' values, in the order of ``ranks`` (the same list on every rank).

        Raises:
            TransportTimeout: a rank's value or the result did not arrive within ``timeout_s``.
            ValueError: this rank or ``root`` is not in ``ranks``.
        """
        ranks = [int(r) for r in ranks]
        if self.rank not in ranks or root not in ranks:
            raise ValueError(f"gather_at: rank {self.rank} and root {root} must be in ranks {ranks}")
        if self.rank != root:
            self.send(root, channel, value, tag=tag)
            return self.recv(result_channel, source=root, tag=tag, timeout_s=timeout_s).obj
        rows = [value if r == root else self.recv(channel, source=r, tag=tag, timeout_s=timeout_s).obj for r in ranks]
        for r in [r for r in ranks if r != root]:
            self.send(r, result_channel, rows, tag=tag)
        return rows

    def wait(self, channels, timeout_s):
        """Wait up to ``timeout_s`` seconds for any message to be queued on one of ``channels``.

        Args:
            channels: a channel name or a list of them. timeout_s: float seconds >= 0.

        Returns:
            bool, True if a message is queued (read it with :meth:`poll` or :meth:`recv`).

        Raises:
            TransportError: the dispatcher failed.
        """
        channels = [channels] if isinstance(channels, str) else list(channels)
        for channel in channels:
            self._check_channel(channel)
        self._check_timeout(timeout_s)
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while True:
                if any(not isinstance(m.obj, _End) for ch in channels for m in self._queues.get(ch, ())):
                    return True
                if self._error is not None:
                    raise TransportError(self._error)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cv.wait(remaining)

    def drain(self, channel, peers=None, timeout_s=DEFAULT_TIMEOUT_S):
        """End a round of traffic on ``channel`` exactly and discard what this rank never read.

        Sends an end marker to every peer, waits for the end marker of every peer, then removes
        each peer's messages queued before its marker (they were sent before the peer drained
        and never read here) and counts them as ``discarded``. Messages a peer sent after its
        marker (its next use of the channel) stay queued. Every rank in ``peers`` must drain the
        same channel.

        Args:
            channel: str. peers: None (every rank, this one included) or a list of int ranks.
            timeout_s: float seconds >= 0 to wait for the peers' markers.

        Returns:
            int, the number of unread messages discarded.

        Raises:
            TransportTimeout: some peers' markers did not arrive in time (names them and the channel).
            TransportError: the dispatcher failed or was shut down.
        """
        self._check_channel(channel)
        timeout_s = self._check_timeout(timeout_s)
        peers = list(range(self.size)) if peers is None else sorted({self._check_peer(p, "drain: peer") for p in peers})
        for p in peers:
            self.send(p, channel, _END)
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while True:
                ended = {m.source for m in self._queues.get(channel, ()) if isinstance(m.obj, _End)}
                missing = [p for p in peers if p not in ended]
                if not missing:
                    break
                self._check_usable()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TransportTimeout(
                        f"rank {self.rank}: timed out after {timeout_s:g} s draining channel {channel!r}: no end "
                        f"marker from rank(s) {missing}", pending=[(p, channel, None) for p in missing])
                self._cv.wait(remaining)
            keep, done, discarded = collections.deque(), set(), 0
            for m in self._queues[channel]:
                if m.source in peers and m.source not in done:
                    if isinstance(m.obj, _End):
                        done.add(m.source)
                    else:
                        discarded += 1
                    continue
                keep.append(m)
            self._queues[channel] = keep
            self._counts[channel]["discarded"] += discarded
            return discarded

    # -- statistics and shutdown --------------------------------------------------------------------
    def stats(self):
        """Return ``{channel: {counter: int}}`` (counters in :data:`COUNTERS`) for every channel used."""
        with self._cv:
            return {ch: dict(c) for ch, c in self._counts.items()}

    def pending_sends(self):
        """Return the number of sends not completed yet (int)."""
        with self._cv:
            return len(self._sends)

    def shutdown(self, timeout_s=5.0):
        """Stop the dispatcher: wait for sends, count what is in flight, join the thread, free the communicator.

        Sends still outstanding after ``timeout_s`` are cancelled and counted as ``undelivered``;
        messages received but never read are counted as ``discarded``. A warning names them if any.
        Idempotent: a second call returns the first call's report.

        Args:
            timeout_s: float seconds >= 0, for the sends and again for the thread.

        Returns:
            dict: ``undelivered_sends`` (int), ``unread_messages`` ({channel: int}),
            ``thread_stopped`` (bool), ``channels`` (:meth:`stats`).
        """
        self._check_timeout(timeout_s)
        with self._cv:
            if self._report is not None:
                return self._report
            self._closed = True
        undelivered = []
        try:
            self._wait_sends(lambda s: True, timeout_s, "any channel")
        except TransportTimeout:
            with self._cv:
                undelivered, self._sends = [s for s in self._sends if not s.marker], []
                for s in undelivered:
                    self._counts[s.channel]["undelivered"] += 1
                    try:
                        s.request.Cancel()
                    except Exception:  # noqa: BLE001 - a send already matched cannot be cancelled
                        pass
        self._stop.set()
        self._thread.join(timeout_s)
        stopped = not self._thread.is_alive()
        with self._cv:
            unread = {}
            for ch, queue in self._queues.items():
                n = sum(1 for m in queue if not isinstance(m.obj, _End))
                if n:
                    unread[ch] = n
                    self._counts[ch]["discarded"] += n
            self._queues.clear()
            self._cv.notify_all()
        if stopped and not self._MPI.Is_finalized():
            self._comm.Free()
        report = {"undelivered_sends": len(undelivered), "unread_messages": unread, "thread_stopped": stopped,
                  "channels": self.stats()}
        if undelivered or unread or not stopped:
            log.warning("hetsync rank %d: point-to-point shutdown: %d undelivered send(s) %s, unread messages %s%s",
                        self.rank, len(undelivered), sorted({(s.dest, s.channel) for s in undelivered}), unread,
                        "" if stopped else f"; the receive thread did not stop within {timeout_s:g} s")
        with self._cv:
            self._report = report
        return report

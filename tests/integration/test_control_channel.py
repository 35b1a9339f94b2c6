"""The control channel between a launcher and a supervisor (``ferry.proc._control``), on
a real socket pair and real processes: messages cross whole and in order both ways, a
message many times the socket's buffer crosses without a send ever blocking, and the
end of the peer (closed, exited, killed) reads as ChannelClosed on either side."""

from __future__ import annotations

import os
import signal
import time

import pytest

from ferry.proc._control import Channel, ChannelClosed, channel_pair

pytestmark = pytest.mark.timeout(60)


def _pair() -> tuple[Channel, Channel]:
    ours, theirs = channel_pair()
    return Channel(ours), Channel(theirs)


def test_messages_cross_whole_and_in_order_both_ways() -> None:
    launcher, supervisor = _pair()
    for n in range(100):
        launcher.send("task", n=n, text="\n\x00é" * n)  # (newlines inside: escaped)
    supervisor.send("plan", record=None)
    got: list[dict[str, object]] = []
    while len(got) < 100:
        got.extend(supervisor.wait(5.0))
    assert got == [{"t": "task", "n": n, "text": "\n\x00é" * n} for n in range(100)]
    assert launcher.wait(5.0) == [{"t": "plan", "record": None}]
    launcher.close()
    supervisor.close()


def test_a_message_larger_than_the_buffer_crosses_whole_and_no_send_blocks() -> None:
    launcher, supervisor = _pair()
    argv = [f"{n:05d}" + "x" * 1000 for n in range(4000)]  # 4 MB: in 64 KiB frames
    started = time.monotonic()
    launcher.send("task", argv=argv)
    launcher.send("go")
    assert launcher.pending  # (what the socket cannot take waits: never a blocking send)
    assert time.monotonic() - started < 5
    got: list[dict[str, object]] = []
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        launcher.flush()
        got.extend(supervisor.receive())
    assert got == [{"t": "task", "argv": argv}, {"t": "go"}]
    assert not launcher.pending


def test_a_send_to_a_peer_gone_is_remembered_not_raised() -> None:
    launcher, supervisor = _pair()
    supervisor.close()
    launcher.send("go")
    assert launcher.closed
    with pytest.raises(ChannelClosed):
        launcher.receive()


def _fork(body: object) -> int:
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            status = body()  # type: ignore[operator]
        finally:
            os._exit(status)
    return pid


def test_the_death_of_the_supervisor_ends_the_launcher_s_wait() -> None:
    """kill -9 of the peer: its descriptors close with it; no message needed."""
    ours, theirs = channel_pair()

    def supervisor() -> int:
        ours.close()
        Channel(theirs).send("plan", record=None)
        time.sleep(60)
        return 0

    pid = _fork(supervisor)
    theirs.close()  # (else our own copy of its end would keep the pair open)
    launcher = Channel(ours)
    assert launcher.wait_for(("plan",), 10.0) == {"t": "plan", "record": None}
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ChannelClosed):
        launcher.wait(10.0)
    os.waitpid(pid, 0)


def test_the_end_of_the_launcher_ends_the_supervisor_s_wait() -> None:
    ours, theirs = channel_pair()

    def supervisor() -> int:
        ours.close()
        channel = Channel(theirs)
        try:
            channel.wait_for(("task",), 20.0)
        except ChannelClosed:
            return 7  # (what the test wants to see)
        return 3

    pid = _fork(supervisor)
    theirs.close()
    Channel(ours).close()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 7


def test_what_a_peer_sent_before_it_died_is_read_though_our_message_was_unread() -> None:
    """A supervisor sends its plan, then dies with a message of ours unread (a ``stop``):
    the kernel reports ECONNRESET on our next read, before the packets still queued.
    That read ended the channel, and the plan was lost: ``work`` then gave back a task
    that had started (found by a review: it ran twice)."""
    ours, theirs = (Channel(s) for s in channel_pair())
    theirs.send("plan", record=["DISPATCHING", {}])
    ours.send("stop", signal=15)  # (never read)
    theirs.sock.close()
    assert [m["t"] for m in ours.receive()] == ["plan"]
    with pytest.raises(ChannelClosed):
        ours.receive()

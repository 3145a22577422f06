"""server.parent: a worker learns of its supervisor's death from the kernel's signal, not from
getppid(), which still names the supervisor while the rest of its threads are exiting; the
signal stops it, and its repeats never end it early."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.support import free_port

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")

# The "supervisor": starts a worker that follows it, then its main thread exits while another
# thread lives on (what a SIGKILL does for a moment: the main thread goes first). The worker
# reports what it saw on stdout, which it shares.
_SUPERVISOR = textwrap.dedent(
    """
    import ctypes, os, subprocess, sys, threading, time
    worker = '''
    import os, sys, time
    from router.server import parent
    supervisor = int(sys.argv[1])
    got = []
    parent.on_gone(lambda: got.append(os.getppid()))
    parent.follow(supervisor)
    print("following", flush=True)
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    print("gone", parent.orphaned(), "ppid still the supervisor", got == [supervisor], flush=True)
    '''
    child = subprocess.Popen([sys.executable, "-c", worker, str(os.getpid())], stdout=sys.stdout)
    time.sleep(0.5)
    # The other thread outlives the main one until the worker has answered.
    threading.Thread(target=lambda: (child.wait(), os._exit(0))).start()
    ctypes.CDLL(None).pthread_exit(None)
    """
)

# A worker's stop, in a process of its own, with GONE sent to itself: the first GONE stops it
# (or a SIGTERM does, `first`), and GONE again while it drains and after (the kernel sends one
# per exiting thread of the supervisor) is only noted; it is orphaned either way.
_STOPPING = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    import uvloop
    from aiohttp import web
    from router.server import parent
    from router.server.run import run_until_signal

    first = getattr(signal, sys.argv[2])

    def send(sig):
        os.kill(os.getpid(), sig)

    async def main():
        parent.watch()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        parent.on_gone(lambda: loop.call_soon_threadsafe(stop.set))
        runner = web.AppRunner(web.Application(), handle_signals=False)
        await run_until_signal(
            runner, sys.argv[1], lambda url: loop.call_soon(send, first),
            lambda: (send(parent.GONE), send(parent.GONE)), stop=stop,
        )
        send(parent.GONE)

    uvloop.run(main())
    send(parent.GONE)
    print("stopped, orphaned", parent.orphaned(), flush=True)
    """
)


def test_a_follower_is_signalled_when_its_parents_main_thread_exits() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _SUPERVISOR], capture_output=True, text=True, timeout=30
    )
    assert out.stdout.splitlines() == ["following", "gone True ppid still the supervisor True"]


@pytest.mark.parametrize("first", ["SIGUSR2", "SIGTERM"])
def test_a_worker_notes_its_supervisors_death_whenever_it_comes(first: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _STOPPING, f"127.0.0.1:{free_port()}", first],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (out.returncode, out.stdout) == (0, "stopped, orphaned True\n"), out.stderr


def test_following_a_supervisor_that_is_not_the_parent_refuses_to_start() -> None:
    # In a child: follow() ties the calling process to its parent.
    code = "from router.server import parent; parent.follow(1)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert "StartupError: the supervisor (pid 1) exited before this worker started" in out.stderr

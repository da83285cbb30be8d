"""``python -m integrations.vllm_v1.serving`` under a supervisor's signals: engine death is a
failure exit, SIGTERM/SIGINT stop vLLM's server, its engine and workers, release the port and
remove the metrics directory. Each test starts its own server (it ends it)."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import psutil
import pytest

from integrations.vllm_v1.instruments.tiny_model import tiny_model_dir
from integrations.vllm_v1.serving.server import KV_SPACE_ENV, offline_env
from tests.helpers.http import free_port

pytestmark = pytest.mark.engine

TINY_DUMMY_ARGS = ("--load-format", "dummy", "--dtype", "float32", "--max-model-len", "2048",
                   "--enforce-eager", "--block-size", "32")
STOP_BOUND_S = 120
"""Generous bound for a stop on a loaded 2-core machine (a failure bound, not a target)."""


class CLI:
    """The CLI as a supervisor runs it, and the process tree it started."""

    def __init__(self, tmp_path):
        self.port = free_port()
        self.log = tmp_path / "cli.log"
        with open(self.log, "wb") as sink:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "integrations.vllm_v1.serving", "--pipeline", "identity",
                 "--port", str(self.port), "--model", str(tiny_model_dir("dummy")), "--",
                 *TINY_DUMMY_ARGS, "--kv-cache-memory-bytes", str(64 << 20)],
                stdout=sink, stderr=subprocess.STDOUT, env=offline_env(),
                start_new_session=True)
        self.tree: list[psutil.Process] = []

    def wait_until_healthy(self, timeout_s=400):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            url = f"http://127.0.0.1:{self.port}/health"
            with (contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError),
                  urllib.request.urlopen(url, timeout=2)):
                self.tree = psutil.Process(self.process.pid).children(recursive=True)
                return
            time.sleep(1)
        raise TimeoutError(self.log.read_text()[-3000:])

    @property
    def api_server(self):
        return next(p for p in self.tree if p.ppid() == self.process.pid)

    def engine_core(self):
        return next(p for p in self.tree if "EngineCore" in " ".join([p.name(), *p.cmdline()]))

    def alive(self):
        """The processes of the tree that still run (zombies are gone for good)."""
        running = []
        for process in self.tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                if process.status() != psutil.STATUS_ZOMBIE:
                    running.append(process)
        return running

    def cleanup(self):
        if self.process.poll() is None:
            self.process.kill()
        for process in self.alive():
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(30)


@pytest.fixture
def cli(tmp_path):
    handle = CLI(tmp_path)
    try:
        handle.wait_until_healthy()
        handle.metrics_dir = handle.api_server.environ()["PROMETHEUS_MULTIPROC_DIR"]
        assert os.path.isdir(handle.metrics_dir)
        # the KV size on the command line holds: the CPU default that would override it
        # (set in this test's environment) reaches neither the API server nor the engine
        assert KV_SPACE_ENV in os.environ
        for process in (handle.api_server, handle.engine_core()):
            assert KV_SPACE_ENV not in process.environ()
        yield handle
    finally:
        handle.cleanup()


def port_is_free(port):
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_engine_death_makes_the_cli_exit_non_zero(cli):
    engine = cli.engine_core()
    engine.kill()  # kill -9
    status = cli.process.wait(STOP_BOUND_S)
    assert status != 0, cli.log.read_text()[-2000:]
    assert not os.path.exists(cli.metrics_dir)
    assert cli.alive() == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_stops_everything_and_releases_port_and_metrics_dir(cli, signum):
    os.kill(cli.process.pid, signum)  # to the CLI alone, as docker stop / systemd send it
    status = cli.process.wait(STOP_BOUND_S)
    assert status == 0, cli.log.read_text()[-2000:]
    assert cli.alive() == []
    assert port_is_free(cli.port)
    assert not os.path.exists(cli.metrics_dir)

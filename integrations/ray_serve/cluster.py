"""`LocalCluster`: a multi-node Ray cluster on one machine, with Ray Serve, for tests and demos.

``ray.cluster_utils.Cluster`` starts a head node and further nodes as separate raylets
on this machine: Ray schedules replicas across them as across machines (placement,
``max_replicas_per_node``, node failure), though they share the CPUs.

By default every Ray process and the Serve HTTP proxy listen on 127.0.0.1 only. Ray
resolves a loopback address to the machine's address (its driver would then look for
the head node where it does not listen) unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
is set before Ray is imported: importing this module sets it when Ray is not imported
yet; when Ray was imported without it, the nodes listen on the machine's address (with a
warning) and only Serve's HTTP proxy on 127.0.0.1.

vLLM's CPU engine binds its OpenMP threads to cores it picks from its own view of the
machine (``VLLM_CPU_OMP_THREADS_BIND=auto``), so every replica on one machine picks the
same ones (core 0 on a 2-core machine) and their forward passes share them. Each node's
processes are therefore given their own share of the cores (`engine_core_binds`), unless
``VLLM_CPU_OMP_THREADS_BIND`` is already set.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import warnings

import attrs

from integrations.environment import child_environment

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch that makes it use the loopback address as the node address when "0"."""

if "ray" not in sys.modules:
    os.environ.setdefault(LOOPBACK_ENV, "0")


OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
"""vLLM's CPU thread binding: ``auto``, ``nobind`` or a core list (``0-3``, ``5``)."""


def engine_core_binds(nodes: int, cpus: int) -> list[str]:
    """Each node's share of ``cpus`` cores, as ``VLLM_CPU_OMP_THREADS_BIND`` values: equal
    contiguous ranges, node ``i`` on core ``i mod cpus`` where there are fewer cores than
    nodes."""
    if nodes < 1 or cpus < 1:
        raise ValueError(f"nodes and cpus must be >= 1, got {nodes!r}, {cpus!r}")
    share = max(1, cpus // nodes)
    binds = []
    for index in range(nodes):
        first = (index * share) % cpus
        binds.append(str(first) if share == 1 else f"{first}-{first + share - 1}")
    return binds


def _cpus() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


_AGENT_PORTS = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port",
                "runtime_env_agent_port")


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


@attrs.define(eq=False, kw_only=True)
class LocalCluster:
    """Ray (``nodes`` nodes of ``cpus_per_node`` logical CPUs) and Ray Serve; a context manager.

    ``connect()`` starts everything and returns once Serve's HTTP proxy listens on
    ``host:http_port``; ``shutdown()`` stops Serve, disconnects and stops every node.
    """

    nodes: int = attrs.field(default=2, validator=attrs.validators.ge(1))
    cpus_per_node: float = attrs.field(default=2.0)
    host: str = "127.0.0.1"
    http_port: int = 8000
    object_store_bytes: int = 150 << 20
    log_to_driver: bool = False
    """Show the replicas' logs in this process (vLLM's are long)."""
    start_attempts: int = attrs.field(default=5, validator=attrs.validators.ge(1))
    """Tries to start the nodes (see `connect`)."""
    startup_s: float = attrs.field(init=False, default=0.0)
    """Seconds `connect` took."""
    _cluster: object = attrs.field(init=False, default=None)

    def connect(self) -> LocalCluster:
        """Start the nodes, connect this process, start Serve; returns self.

        A node's raylet gives its dashboard agent 15 s to publish the port it listens on, and
        the node 30 s to register with the head; on a loaded machine either can pass (the
        agent's imports alone took 15-19 s on 2 shared cores at load 13), so a start that
        times out is undone and tried again (``start_attempts`` in all).
        """
        started = time.monotonic()
        for attempt in range(1, self.start_attempts + 1):
            try:
                self._start()
                break
            except Exception as error:  # noqa: BLE001 - Ray raises a bare Exception on timeout
                self.shutdown()
                if attempt == self.start_attempts or "timed out" not in str(error):
                    raise
        self.startup_s = time.monotonic() - started
        return self

    def _start(self) -> None:
        import ray
        from ray import serve
        from ray.cluster_utils import Cluster

        node = {"num_cpus": self.cpus_per_node, "object_store_memory": self.object_store_bytes}
        if self.host not in ("127.0.0.1", "localhost") or os.environ.get(LOOPBACK_ENV) == "0":
            node["node_ip_address"] = self.host
        else:
            warnings.warn(f"Ray was imported before {LOOPBACK_ENV}=0 was set: its nodes listen "
                          "on this machine's address, only Serve's HTTP proxy on "
                          f"{self.host} (import integrations.ray_serve.cluster first)",
                          stacklevel=3)
        self._cluster = Cluster()
        binds = None if OMP_BIND_ENV in os.environ else engine_core_binds(self.nodes, _cpus())
        for index in range(self.nodes):  # the first is the head, without Ray's dashboard
            # Fixed agent ports: the raylet then need not wait (15 s at most) for the agents to
            # publish two of them, which a loaded machine can miss.
            ports = {name: _free_port(self.host) for name in _AGENT_PORTS}
            head = {"include_dashboard": False} if index == 0 else {}
            bind = {} if binds is None else {OMP_BIND_ENV: binds[index]}
            with child_environment(bind):  # the node's raylet and workers inherit it
                self._cluster.add_node(**node, **ports, **head)
        ray.init(address=self._cluster.address, log_to_driver=self.log_to_driver)
        serve.start(http_options={"host": self.host, "port": self.http_port})

    @property
    def url(self) -> str:
        """Serve's HTTP address."""
        return f"http://{self.host}:{self.http_port}"

    def node_ids(self) -> list[str]:
        """The Ray node ids of the live nodes, head first."""
        import ray

        return [n["NodeID"] for n in sorted(ray.nodes(), key=lambda n: not n.get("is_head_node"))
                if n.get("Alive")]

    def shutdown(self) -> None:
        """Stop Serve and every node (idempotent)."""
        import ray
        from ray import serve

        try:
            if ray.is_initialized():
                serve.shutdown()
        finally:
            if ray.is_initialized():
                ray.shutdown()
            if self._cluster is not None:
                self._cluster.shutdown()
                self._cluster = None

    def __enter__(self) -> LocalCluster:
        return self.connect()

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

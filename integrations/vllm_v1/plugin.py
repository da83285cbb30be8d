"""vLLM plugin (entry point group ``vllm.general_plugins``): registers this project's
components under short names in every vLLM process, so plain flags can name them.

With the package installed, vLLM runs `register` at start-up; then

* ``--kv-transfer-config '{"kv_connector": "KVTierConnector", "kv_role": "kv_both", ...}'``
  needs no ``kv_connector_module_path``;
* the native offloading connector's ``kv_connector_extra_config`` takes
  ``"eviction_policy": "segmented_lru"`` with no ``cache_policy_module_path``.

The scheduler is named with ``--scheduler-cls`` (vLLM has no scheduler registry) and
the HTTP middleware with ``--middleware``; see `integrations.vllm_v1.config.spec`.

In vLLM's OpenAI server process (``vllm serve`` or ``python -m
vllm.entrypoints.openai.api_server``), when ``--additional-config`` declares our entry,
`register` also, before vLLM reads its command line:

* checks the entry as vLLM will parse it, in every spelling vLLM accepts
  (``--additional_config``, ``--flag=value``, ``--config file.yaml``, dotted keys), and
  exits listing every problem at once (`check_command_line`): the pipeline, the ``slo``
  declaration, the hooks, the serving keys, ``--scheduling-policy``; it warns about
  SLO targets that look like milliseconds written as seconds;
* turns on the rejection channel (`integrations.vllm_v1.serving.rejection_channel`):
  a fresh address in the entry, which the API server and the engine core read from the
  same parsed configuration;
* turns on Prometheus' multiprocess mode (a fresh ``PROMETHEUS_MULTIPROC_DIR``, removed
  at exit), so the scheduler's ``policies:*`` metrics, written in the engine-core
  process, show on the server's ``/metrics`` beside vLLM's;
* logs one line naming what it could not turn on, and how to.

It also turns off uvicorn's default trust in ``X-Forwarded-For`` from ``127.0.0.1``
(`UVICORN_TRUSTED_PROXIES`), so a request's address is its connection's peer unless
``FORWARDED_ALLOW_IPS`` is set on purpose: our trusted-gateway check
(`integrations.vllm_v1.serving.tenants`) must not take a client's word for where it
is.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import json
import logging
import multiprocessing
import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import Any

KV_CONNECTORS = {"KVTierConnector": ("integrations.vllm_v1.cache.tiers.connector",
                                     "KVTierConnector")}
CACHE_POLICIES = {"segmented_lru": ("integrations.vllm_v1.cache.offload_policy",
                                    "SegmentedLRUCachePolicy")}
UVICORN_TRUSTED_PROXIES = "FORWARDED_ALLOW_IPS"
"""uvicorn's list of peers whose ``X-Forwarded-For`` it believes (its default: 127.0.0.1)."""
SERVER_MODULES = ("vllm.entrypoints.openai.api_server",
                  "vllm.entrypoints.launchers.api_server.entry")
"""Modules that run vLLM's OpenAI server with ``python -m``."""
SLO_SANE_S = (0.001, 60.0)
"""SLO targets (seconds) outside this range are warned about at start-up."""
_DOTTED = re.compile(r"^--additional[-_]config\.")
_ADDITIONAL = re.compile(r"^(?P<flag>--additional[-_]config)(?P<eq>=|$)")
_LOG = logging.getLogger("vllm.llm_serving_policies")


def register() -> None:
    """Register the KV connector and offload cache policy names, trust no proxy by default
    and, in vLLM's OpenAI server, check our ``--additional-config`` and complete the
    server for it (idempotent).

    Raises:
        SystemExit: listing the problems of a bad ``--additional-config``.
    """
    from integrations.vllm_v1.vllm_surface.names import (
        register_cache_policy,
        register_kv_connector,
    )

    for name, (module, cls) in KV_CONNECTORS.items():
        register_kv_connector(name, module, cls)
    for name, (module, cls) in CACHE_POLICIES.items():
        register_cache_policy(name, module, cls)
    os.environ.setdefault(UVICORN_TRUSTED_PROXIES, "")
    if multiprocessing.parent_process() is None and runs_openai_server(sys.argv):
        from integrations.vllm_v1.config.declarative import PipelineConfigError

        try:
            args = check_command_line(sys.argv)
        except PipelineConfigError as error:
            problems = str(error).splitlines()
            head = "llm_serving_policies: bad --additional-config"
            raise SystemExit(f"{head}: {problems[0]}" if len(problems) == 1 else
                             "\n  ".join([f"{head} ({len(problems)} problems):", *problems])
                             ) from None
        if args is not None:
            complete_server(sys.argv, args)


def runs_openai_server(argv: Sequence[str]) -> bool:
    """Whether this process runs vLLM's OpenAI server (``vllm serve`` or ``python -m``)."""
    if argv[1:2] == ["serve"] and os.path.basename(argv[0]).startswith("vllm"):
        return True
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) in SERVER_MODULES


def parse_command_line(argv: Sequence[str]) -> Any:
    """vLLM's own reading of the server command line ``argv`` (``vllm serve ...`` or the
    module's), or None where vLLM would refuse it, or for ``--help`` (vLLM answers those).
    """
    from integrations.vllm_v1.vllm_surface.names import parse_serve_args

    args = list(argv[2:] if argv[1:2] == ["serve"] else argv[1:])
    if any(arg in ("-h", "--help") or arg.startswith("--help=") for arg in args):
        return None
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            return parse_serve_args(args)
    except (SystemExit, Exception):  # noqa: BLE001 - vLLM's own parse reports it next
        return None


def check_command_line(argv: Sequence[str]) -> Any:
    """Check our entry in the server command line ``argv`` as the engine would, at once.

    Returns:
        vLLM's parsed arguments when they declare our entry, else None.

    Raises:
        PipelineConfigError: one line per problem, each naming its key: a bad pipeline
            (unknown preset, slot or class, a value of the wrong type, a missing file),
            a bad ``slo`` declaration, an unimportable hook, a bad serving key,
            ``--scheduling-policy priority`` with a pipeline that orders requests.
    """
    from integrations.vllm_v1.config.declarative import PipelineConfigError
    from integrations.vllm_v1.config.spec import config_entry

    args = parse_command_line(argv)
    additional = getattr(args, "additional_config", None)
    entry = config_entry(additional)
    if not entry:
        return None
    problems = config_problems(additional, getattr(args, "scheduling_policy", None) or "fcfs")
    if problems:
        raise PipelineConfigError("\n".join(problems))
    for warning in slo_warnings(entry):
        _LOG.warning("llm_serving_policies: %s", warning)
    return args


def config_problems(additional: Mapping[str, Any], scheduling_policy: str) -> list[str]:
    """Every problem of our entry in ``additional`` (vLLM's ``additional_config``), one
    message each, over its sections: the pipeline (with its ``slo``), ``hooks``, the
    serving keys and the scheduling policy."""
    from integrations.vllm_v1.config.declarative import PipelineConfigError
    from integrations.vllm_v1.config.spec import config_entry, pipeline_from_additional_config
    from integrations.vllm_v1.scheduling.features import named_hook
    from integrations.vllm_v1.scheduling.scheduler import check_scheduling_policy
    from integrations.vllm_v1.serving.drain import Drain
    from integrations.vllm_v1.serving.rejection_channel import channel_address
    from integrations.vllm_v1.serving.tenants import TenantBinding

    entry = config_entry(additional)
    problems: list[str] = []

    def collect(check: Any, *args: Any) -> Any:
        try:
            return check(*args)
        except (PipelineConfigError, ValueError) as error:
            problems.extend(str(error).splitlines())
            return None

    pipeline = collect(pipeline_from_additional_config, additional)
    hooks = entry.get("hooks") or ()
    if isinstance(hooks, list | tuple):
        for path in hooks:
            collect(named_hook, path)
    else:
        problems.append(f"llm_serving_policies.hooks must be a list of import paths, "
                        f"got {hooks!r}")
    collect(TenantBinding.from_entry, entry)
    collect(Drain.from_entry, entry)
    collect(channel_address, entry)
    if pipeline is not None:
        collect(check_scheduling_policy, pipeline, scheduling_policy)
    return problems


def slo_warnings(entry: Mapping[str, Any]) -> list[str]:
    """SLO targets of the served pipeline's declaration (the ``slo`` preset's, or one a
    pipeline built in Python carries) outside `SLO_SANE_S` (a target in milliseconds written
    where seconds go, most likely)."""
    from integrations.vllm_v1.config.spec import served_slo

    spec = served_slo(entry)
    if spec is None:
        return []
    declared = entry.get("pipeline") == "slo"
    low, high = SLO_SANE_S
    warnings = []
    for name, target in spec.classes.items():
        for key in ("ttft_s", "tpot_s"):
            value = getattr(target, key)
            field = (f"llm_serving_policies.slo.classes.{name}.{key}" if declared
                     else f"Pipeline.slo class {name!r} {key}")
            if value > high:
                warnings.append(f"{field} is {value:g} s, over {high:g} s: did you mean "
                                f"milliseconds? (seconds go here: {value / 1000:g})")
            elif value < low:
                warnings.append(f"{field} is {value:g} s, under {low * 1000:g} ms: is it in "
                                "seconds?")
    return warnings


def complete_server(argv: list[str], args: Any) -> None:
    """Turn on, for the server ``argv`` runs, what our entry needs and vLLM's flags left off:
    the rejection channel for our middleware (a fresh address written into ``argv``, where
    vLLM reads it) and multiprocess metrics; log one line naming what is still missing and
    how to add it."""
    from integrations.vllm_v1.config.spec import config_entry
    from integrations.vllm_v1.serving.middleware import PATH as MIDDLEWARE_PATH
    from integrations.vllm_v1.serving.rejection_channel import CHANNEL_KEY

    missing = []
    if not _runs_pipeline(getattr(args, "scheduler_cls", None)):
        missing.append("the pipeline does not run: add --scheduler-cls "
                       "integrations.vllm_v1.scheduling.scheduler.PolicyScheduler "
                       "(AsyncPolicyScheduler under asynchronous scheduling)")
    if MIDDLEWARE_PATH not in (getattr(args, "middleware", None) or ()):
        missing.append(f"rejections are not answered 503 with their reason: add --middleware "
                       f"{MIDDLEWARE_PATH}")
    elif config_entry(args.additional_config).get(CHANNEL_KEY) is None:  # the middleware's
        completed = with_rejection_channel(argv, args.additional_config)
        if completed is None:
            missing.append(f"the rejection channel is off (streamed, Responses and Messages "
                           f"rejections answer without their reason): add "
                           f"\"{CHANNEL_KEY}\": \"ipc://@<a unique name>\" to "
                           f"llm_serving_policies")
        else:
            argv[:] = completed
    problem = multiprocess_metrics()
    if problem:
        missing.append(problem)
    if missing:
        _LOG.warning("llm_serving_policies: not fully on: %s", "; ".join(missing))


def _runs_pipeline(scheduler_cls: object) -> bool:
    """Whether vLLM's ``scheduler_cls`` runs a pipeline (True if it cannot be imported:
    vLLM says so itself)."""
    from integrations.vllm_v1.scheduling.scheduler import PolicySchedulerMixin

    if isinstance(scheduler_cls, str):
        module, _, name = scheduler_cls.rpartition(".")
        try:
            scheduler_cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            return True
    return isinstance(scheduler_cls, type) and issubclass(scheduler_cls, PolicySchedulerMixin)


def with_rejection_channel(argv: Sequence[str], additional: Mapping[str, Any]
                           ) -> list[str] | None:
    """``argv`` with a fresh rejection channel address in our entry, or None if vLLM would
    not read it back (checked by parsing the result as vLLM will)."""
    from integrations.vllm_v1.config.spec import CONFIG_KEY
    from integrations.vllm_v1.serving.rejection_channel import CHANNEL_KEY, new_channel_address

    address = new_channel_address()
    wanted = {**additional, CONFIG_KEY: {**additional[CONFIG_KEY], CHANNEL_KEY: address}}
    if any(_DOTTED.match(arg) for arg in argv):  # vLLM puts dotted keys last: add one more
        completed = [*argv, f"--additional-config.{CONFIG_KEY}.{CHANNEL_KEY}={address}"]
    else:
        completed = _with_additional_config(argv, json.dumps(wanted))
    reparsed = parse_command_line(completed)
    if getattr(reparsed, "additional_config", None) != wanted:
        return None
    return completed


def _with_additional_config(argv: Sequence[str], value: str) -> list[str]:
    """``argv`` with its last ``--additional-config`` (any spelling) set to ``value``, or
    with the flag added when it has none (one in a ``--config`` file), so that vLLM is not
    given the flag twice."""
    for index in range(len(argv) - 1, -1, -1):
        found = _ADDITIONAL.match(argv[index])
        if found is None:
            continue
        if found.group("eq"):
            return [*argv[:index], f"{found.group('flag')}={value}", *argv[index + 1:]]
        if index + 1 < len(argv):
            return [*argv[:index + 1], value, *argv[index + 2:]]
    return [*argv, "--additional-config", value]


def multiprocess_metrics() -> str | None:
    """Turn on Prometheus' multiprocess mode for this process and the engine processes it
    starts, unless ``PROMETHEUS_MULTIPROC_DIR`` is set already; what failed, if anything.

    vLLM's ``/metrics`` then reads every process's metrics from the folder (as it does
    with several API servers); without it the engine core's ``policies:*`` metrics stay in
    that process. The folder is removed at exit (or, after ``kill -9``, by the next start:
    `integrations.vllm_v1.serving.server.new_metrics_dir`).
    """
    from integrations.vllm_v1.metrics import MULTIPROC_ENV
    from integrations.vllm_v1.serving.server import new_metrics_dir

    if os.environ.get(MULTIPROC_ENV):
        return None
    try:
        from prometheus_client import values

        folder = new_metrics_dir()
        os.environ[MULTIPROC_ENV] = folder
        # prometheus_client picks its value store at import, already done here: pick again.
        values.ValueClass = values.get_value_class()
    except (ImportError, OSError, AttributeError) as error:
        os.environ.pop(MULTIPROC_ENV, None)
        return (f"policies:* metrics are not on /metrics ({error}): set {MULTIPROC_ENV} to an "
                "empty folder before starting the server")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return None

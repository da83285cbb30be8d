"""Every request bound for the engine is checked before vLLM sees it (`forward_checked`).

`integrations.vllm_v1.serving.middleware.PolicyMiddleware` calls it on the routes
that reach the scheduler, found in the app's own routes
(`integrations.vllm_v1.serving.routes`), so every such route gets the same rules and
messages, new ones included. For each request, in order:

1. **who** (only with tenants or a gateway configured, see
   `integrations.vllm_v1.serving.tenants`): the credential names the tenant, else 401;
2. **what**: the scheduling metadata, with the engine's own validation (the same
   messages), else 400: ``priority`` (where the route's body model has the field),
   the ``X-Vllm-Priority`` header (an integer, sent at most once: vLLM reads the
   first of several, a proxy in front may read the last, so two are refused), and
   ``vllm_xargs`` ``tenant`` / ``slo_class`` / ``deadline_ms``; with an SLO declaration
   (`integrations.vllm_v1.config.spec.served_slo`), a ``slo_class`` must be one it declares;
3. **may it**: a tenant named in ``vllm_xargs`` must be the credential's, and the
   priority and SLO class within the tenant's limits, else 403. With the ``slo``
   preset, the class must be one the preset allows the tenant
   (`integrations.vllm_v1.config.slo.SLOSpec.allowed_classes`): the credential's
   tenant, none for a request without a credential, or, with no credentials
   configured, the tenant ``vllm_xargs`` names (as the engine takes it);
4. the body goes on with the credential's tenant in ``vllm_xargs.tenant`` (or
   ``sampling_params.extra_args.tenant``, where the route reads those) and the
   rejection ticket (`integrations.vllm_v1.serving.rejection_channel`) added; a route
   that cannot carry a tenant serves only the tenant the engine assumes (403 else).

Bodies that are not JSON objects are left to vLLM's own validation (400 too); a body
over 64 MiB gets 413, one nested too deeply for Python's parser 400, one whose rewrite
JSON cannot write (NaN, Infinity) 400.
"""

from __future__ import annotations

import json
import time
from typing import Any

import attrs

from integrations.vllm_v1.config.slo import SLOSpec
from integrations.vllm_v1.serving.asgi import (
    MAX_BODY_BYTES,
    Receive,
    Scope,
    Send,
    read_body,
    replay,
    send_error,
)
from integrations.vllm_v1.serving.rejection_channel import TICKET_KEY
from integrations.vllm_v1.serving.routes import EngineRoute
from integrations.vllm_v1.serving.tenants import (
    Identity,
    Refusal,
    TenantBinding,
    class_refusal,
)
from policies import InvalidRequestMetadata, parse_request_metadata
from policies.metadata import RECEIVED_KEY
from policies.views import DEFAULT_TENANT

PRIORITY_HEADER = b"x-vllm-priority"


@attrs.frozen(kw_only=True)
class Checked:
    """The outcome of checking one request: an error, or the body to forward."""

    status: int = 0
    message: str = ""
    payload: dict[str, Any] | None = None
    """The body to forward (rewritten), or None to forward the original."""


def check_request(payload: object, headers: list[tuple[bytes, bytes]], route: EngineRoute, *,
                  binding: TenantBinding | None = None, slo: SLOSpec | None = None,
                  client_host: str | None = None, ticket: str | None = None,
                  now: float = 0.0, received_s: float | None = None) -> Checked:
    """Check one engine-bound request (``payload``: its parsed JSON body; ``slo``: the
    ``slo`` preset's declaration, when served; ``received_s``: when the server received it,
    stamped beside the ticket so its SLO clock starts there)."""
    identity: Identity | None = None
    if binding is not None:
        found = binding.identify(headers, client_host, now)
        if isinstance(found, Refusal):
            return Checked(status=found.status, message=found.message)
        identity = found
    if not isinstance(payload, dict):
        return Checked()  # vLLM's own validation answers
    values = [v.decode("latin-1") for k, v in headers if k.lower() == PRIORITY_HEADER]
    if len(values) > 1:
        return Checked(status=400, message=f"X-Vllm-Priority must be sent at most once, got "
                                           f"{len(values)} values")
    body_priority = payload.get("priority", 0) if route.reads_priority else 0
    asked = [body_priority]
    if values:
        try:
            asked.append(int(values[0]))
        except ValueError:
            return Checked(status=400, message="X-Vllm-Priority must be an integer, got "
                                               f"{values[0]!r}")
    holder = _xargs_holder(payload, route)
    if holder is None:
        return Checked()  # vLLM's schema answers this one
    extra_args = holder.get(route.xargs_path[-1]) if route.reads_xargs else None
    if extra_args is not None and not isinstance(extra_args, dict):
        return Checked()  # vLLM's schema answers this one
    try:
        for priority in asked:
            parse_request_metadata(priority, extra_args)
    except InvalidRequestMetadata as error:
        return Checked(status=400, message=str(error))
    claimed, slo_class = ((extra_args or {}).get(key) for key in ("tenant", "slo_class"))
    if slo is not None and slo_class is not None and slo_class not in slo.classes:
        return Checked(status=400, message=f"vllm_xargs.slo_class {slo_class!r} is not "
                                           f"declared: use one of {sorted(slo.classes)}")
    refusal = _class_or_tenant_refusal(identity, binding, slo, claimed, min(asked), slo_class)
    if refusal is not None:
        return Checked(status=refusal.status, message=refusal.message)
    if identity is not None and not route.reads_xargs and identity.tenant != DEFAULT_TENANT:
        return Checked(status=403, message=f"{route.path} cannot carry a tenant to the "
                                           f"scheduler, so tenant {identity.tenant!r} cannot "
                                           "be served on it")
    if not route.reads_xargs or (identity is None and ticket is None):
        return Checked()
    xargs = {k: v for k, v in (extra_args or {}).items() if k not in (TICKET_KEY, RECEIVED_KEY)}
    if identity is not None:
        xargs["tenant"] = identity.tenant
    if ticket is not None:
        xargs[TICKET_KEY] = ticket
        if received_s is not None:
            xargs[RECEIVED_KEY] = received_s
    return Checked(payload=_with_xargs(payload, route.xargs_path, xargs))


def _class_or_tenant_refusal(identity: Identity | None, binding: TenantBinding | None,
                             slo: SLOSpec | None, claimed: str | None, priority: int,
                             slo_class: str | None) -> Refusal | None:
    """403 for a claim beyond the request's tenant (the credential's, or without
    credentials the one it names) or a class the ``slo`` preset does not allow it."""
    if identity is not None:
        allowed = None if slo is None else slo.allowed_classes(
            None if identity.anonymous else identity.tenant)
        return binding.authorize(identity, claimed, priority, slo_class, allowed)
    if slo is None or slo_class is None:
        return None
    who = "a request without a tenant" if claimed is None else f"tenant {claimed!r}"
    return class_refusal(slo_class, slo.allowed_classes(claimed), who)


def _xargs_holder(payload: dict[str, Any], route: EngineRoute) -> dict[str, Any] | None:
    """The mapping that holds the route's extra args (``payload`` or a field of it); None
    when it is not a mapping."""
    holder: Any = payload
    for key in route.xargs_path[:-1] if route.reads_xargs else ():
        holder = holder.get(key) or {}
    return holder if isinstance(holder, dict) else None


def _with_xargs(payload: dict[str, Any], path: tuple[str, ...], xargs: dict[str, Any]
                ) -> dict[str, Any]:
    """``payload`` with ``xargs`` at ``path`` (copies along the path, the original kept)."""
    if len(path) == 1:
        return {**payload, path[0]: xargs}
    inner = payload.get(path[0]) or {}
    return {**payload, path[0]: _with_xargs(inner, path[1:], xargs)}


@attrs.frozen
class Forward:
    """A checked request to pass on: its scope and body, and whether the body carries the
    ticket (so the engine can report a rejection of it)."""

    scope: Scope
    receive: Receive
    ticket_sent: bool = False
    payload: Any = None
    """The body as parsed (None: not JSON)."""


async def forward_checked(scope: Scope, receive: Receive, send: Send, route: EngineRoute, *,
                          binding: TenantBinding | None, ticket: str | None,
                          slo: SLOSpec | None = None,
                          received_s: float | None = None) -> Forward | None:
    """Check the engine-bound request ``scope`` (reading its body): what to pass on, or None
    when it was answered with an error."""
    body = await read_body(receive)
    if body is None:
        await send_error(send, 413, f"request body larger than {MAX_BODY_BYTES} bytes",
                         anthropic=route.anthropic_errors)
        return None
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None  # not JSON: vLLM answers
    except RecursionError:  # vLLM's /invocations would answer 500
        await send_error(send, 400, "request body is JSON nested too deeply",
                         anthropic=route.anthropic_errors)
        return None
    if not route.accepts(payload):
        return Forward(scope, replay(body, receive), payload=payload)
    client = scope.get("client")
    checked = check_request(payload, list(scope.get("headers", [])), route, binding=binding,
                            slo=slo, client_host=client[0] if client else None,
                            ticket=ticket, now=time.time(), received_s=received_s)
    if checked.status:
        await send_error(send, checked.status, checked.message, anthropic=route.anthropic_errors)
        return None
    if checked.payload is None:
        return Forward(scope, replay(body, receive), payload=payload)
    try:
        body = json.dumps(checked.payload, allow_nan=False).encode()
    except ValueError:  # forwarding the original would lose the tenant: refuse
        await send_error(send, 400, "request body holds a number JSON does not allow (NaN or "
                         "Infinity)", anthropic=route.anthropic_errors)
        return None
    scope = {**scope, "headers": _with_length(scope.get("headers", []), len(body))}
    return Forward(scope, replay(body, receive), ticket is not None, checked.payload)


def _with_length(headers: Any, length: int) -> list[tuple[bytes, bytes]]:
    kept = [(k, v) for k, v in headers if k.lower() not in (b"content-length",
                                                            b"transfer-encoding")]
    return [*kept, (b"content-length", str(length).encode())]


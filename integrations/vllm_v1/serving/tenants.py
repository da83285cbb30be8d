"""Tenants bound to credentials: a request's tenant comes from its API key or a gateway.

Without this, a request's tenant is whatever the client writes in ``vllm_xargs.tenant``.
With it, configured in our ``--additional-config`` entry (``llm_serving_policies``):

.. code-block:: json

    {"tenants": {"gold":   {"api_key_env": "GOLD_API_KEY", "min_priority": -20},
                 "bronze": {"api_key_file": "/run/secrets/bronze", "min_priority": 0,
                            "slo_classes": ["batch"]},
                 "partner": {"api_key_sha256": "<hex SHA-256 of the key>"}},
     "require_credential": false,
     "anonymous_tenant": "default"}

* **API keys** in vLLM's ``--api-key`` style, ``Authorization: Bearer <key>``. The
  configuration never holds a key itself: each tenant names an environment variable
  (``api_key_env``), a file (``api_key_file``) or the key's SHA-256 (``api_key_sha256``);
  ``tenants`` may also be the path of a JSON/YAML/TOML file holding the mapping. A
  presented key is hashed and compared with every tenant's digest by
  `hmac.compare_digest`, all of them, whatever matches.
* A request with a tenant's key **is** that tenant: one naming no tenant is served as
  it; one whose ``vllm_xargs.tenant`` names another tenant gets **403**. A key that
  matches no tenant gets **401**. A request without a credential is the
  ``anonymous_tenant`` (``default``), or gets 401 with ``require_credential``.
* **Limits** per tenant: ``min_priority`` (the most urgent priority it may ask for;
  lower is more urgent) and ``slo_classes`` (the classes it may name); beyond them, 403.
  Limits of the anonymous tenant come from a keyless entry of that name. With the ``slo``
  preset, a class must also be one the preset allows the tenant
  (`integrations.vllm_v1.config.slo.SLOSpec.allowed_classes`; for a request without a
  credential, those of no tenant).
* **Trusted gateway** (``"gateway": {...}``): the tenant comes only from a header the
  gateway sets (``tenant_header``, default ``X-LLM-Tenant``), never from an API key.
  The header counts only if signed (``hmac_key_env`` / ``hmac_key_file``: header
  ``X-LLM-Tenant-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(key, "<t>.<tenant>")>``,
  hex in either case, at most ``max_skew_s`` old and ``max_future_s`` ahead, each
  signature accepted once, see `sign_tenant`) and/or sent from ``trusted_sources``
  (IP networks); otherwise 401. The source is the connection's peer address, or,
  when the peer is one of the configured proxy hops (``forwarded_allow_ips``,
  default none), the last address in ``X-Forwarded-For`` that is not a hop itself.
* **Safe defaults**: with tenants or a gateway configured, the anonymous tenant may
  ask for no priority more urgent than 0 and name no SLO class (with the ``slo`` preset:
  only the classes the preset allows no tenant, by default none it protects), unless a
  keyless entry of its name says otherwise. A repeated ``Authorization`` header is 400.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from integrations.vllm_v1.config.declarative import PipelineConfigError
from integrations.vllm_v1.config.slo import SLOSpec
from integrations.vllm_v1.config.spec import CONFIG_KEY
from policies import InvalidRequestMetadata, parse_request_metadata
from policies.views import DEFAULT_TENANT

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_KEY_SOURCES = ("api_key_env", "api_key_file", "api_key_sha256")
_TENANT_FIELDS = frozenset({*_KEY_SOURCES, "min_priority", "slo_classes"})
_GATEWAY_FIELDS = frozenset({"tenant_header", "signature_header", "hmac_key_env",
                             "hmac_key_file", "trusted_sources", "forwarded_allow_ips",
                             "max_skew_s", "max_future_s"})
ANONYMOUS_MIN_PRIORITY = 0
"""The most urgent priority the anonymous tenant may ask for when no keyless entry says."""
MAX_REMEMBERED_SIGNATURES = 100_000
"""Gateway signatures remembered (to refuse a replay) before the oldest are forgotten."""
SERVING_KEYS = ("tenants", "require_credential", "anonymous_tenant", "gateway")
"""The keys of our config entry this module reads."""


@attrs.frozen(kw_only=True)
class TenantGrant:
    """One tenant's credential and limits."""

    name: str
    key_digest: bytes | None = attrs.field(default=None, repr=False)
    """SHA-256 of the tenant's API key (None: a tenant without a key)."""
    min_priority: int | None = None
    """The most urgent (lowest) priority this tenant may ask for; None: any."""
    slo_classes: frozenset[str] | None = None
    """The SLO classes this tenant may name; None: any."""


@attrs.frozen(kw_only=True)
class Gateway:
    """A trusted gateway that states the tenant in a header."""

    tenant_header: str = "x-llm-tenant"
    signature_header: str = "x-llm-tenant-signature"
    hmac_key: bytes | None = attrs.field(default=None, repr=False)
    trusted_sources: tuple[Network, ...] = ()
    forwarded_allow_ips: tuple[Network, ...] = ()
    """Proxy hops between the gateway and this server, whose ``X-Forwarded-For`` counts."""
    max_skew_s: float = 60.0
    """How old a signature's timestamp may be."""
    max_future_s: float = 5.0
    """How far ahead of this server's clock a signature's timestamp may be."""
    seen: dict[str, float] = attrs.field(factory=dict, eq=False, repr=False)
    """Signatures accepted within the skew window -> their timestamp (replays refused)."""

    def source(self, peer: str | None, headers: Sequence[tuple[bytes, bytes]]) -> str | None:
        """The address a request came from: the socket's peer, or through configured hops.

        ``X-Forwarded-For`` is read only when the peer is one of ``forwarded_allow_ips``,
        right to left, skipping further hops; a client's own header is never believed.
        """
        if not _trusted(peer, self.forwarded_allow_ips):
            return peer
        forwarded = [a.strip() for v in _all(headers, b"x-forwarded-for") for a in v.split(",")]
        for address in reversed(forwarded):
            if not _trusted(address, self.forwarded_allow_ips):
                return address
        return forwarded[0] if forwarded else peer

    def accept_once(self, signature: str, timestamp: int, now: float) -> bool:
        """Remember ``signature``; False if it was accepted before (a replay)."""
        if signature in self.seen:
            return False
        if len(self.seen) >= MAX_REMEMBERED_SIGNATURES:
            for old, at in list(self.seen.items()):
                if at < now - self.max_skew_s or len(self.seen) >= MAX_REMEMBERED_SIGNATURES:
                    del self.seen[old]
        self.seen[signature] = timestamp
        return True


@attrs.frozen
class Identity:
    """Who a request is: its tenant and how that was established."""

    tenant: str
    credential: str
    """Where the tenant came from, for messages: ``"its API key"``, ``"the gateway's tenant
    header"`` or ``"a request without a credential"``."""
    grant: TenantGrant | None = None
    anonymous: bool = False
    """The request carried no credential."""


@attrs.frozen
class Refusal:
    """An HTTP error: 401 (who are you?) or 403 (not allowed)."""

    status: int
    message: str


def sign_tenant(tenant: str, key: bytes, timestamp: int) -> str:
    """The gateway signature header value for ``tenant`` at ``timestamp`` (unix seconds)."""
    digest = hmac.new(key, f"{timestamp}.{tenant}".encode(), hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


@attrs.frozen(kw_only=True)
class TenantBinding:
    """The configured tenants, credentials and limits; `identify` then `authorize` a request."""

    grants: Mapping[str, TenantGrant] = attrs.field(factory=dict)
    anonymous_tenant: str = DEFAULT_TENANT
    require_credential: bool = False
    gateway: Gateway | None = None
    anonymous_slo_classes: frozenset[str] | None = frozenset()
    """The SLO classes the anonymous tenant may name when no keyless entry says: none, or
    None (any) where an SLO declaration decides (`authorize`'s ``slo_allowed``)."""

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any], environ: Mapping[str, str] | None = None,
                   *, slo: SLOSpec | None = None) -> TenantBinding | None:
        """The binding our config entry describes; None when it configures none. ``slo``: the
        served pipeline's declaration (`config.spec.served_slo`), which lets the anonymous
        tenant name classes; None: it may name none.

        Raises:
            PipelineConfigError: naming the key that is wrong (a missing key source too).
        """
        if not any(entry.get(key) is not None for key in SERVING_KEYS):
            return None
        environ = os.environ if environ is None else environ
        tenants = _tenants_mapping(entry.get("tenants"))
        grants = {name: _grant(name, spec, environ) for name, spec in tenants.items()}
        digests = [g.key_digest for g in grants.values() if g.key_digest is not None]
        if len(set(digests)) != len(digests):
            raise PipelineConfigError(f"{CONFIG_KEY}.tenants: two tenants share one API key")
        anonymous = entry.get("anonymous_tenant", DEFAULT_TENANT)
        _check_name(f"{CONFIG_KEY}.anonymous_tenant", anonymous)
        if anonymous in grants and grants[anonymous].key_digest is not None:
            raise PipelineConfigError(f"{CONFIG_KEY}.anonymous_tenant {anonymous!r} has an API "
                                      "key: the anonymous tenant is the one without")
        require = entry.get("require_credential", False)
        if not isinstance(require, bool):
            raise PipelineConfigError(f"{CONFIG_KEY}.require_credential must be true or false, "
                                      f"got {require!r}")
        gateway = entry.get("gateway")
        return cls(grants=grants, anonymous_tenant=anonymous, require_credential=require,
                   gateway=None if gateway is None else _gateway(gateway, environ),
                   anonymous_slo_classes=None if slo is not None else frozenset())

    @property
    def keyed(self) -> bool:
        """Whether any tenant has an API key."""
        return any(g.key_digest is not None for g in self.grants.values())

    def identify(self, headers: Sequence[tuple[bytes, bytes]], client_host: str | None,
                 now: float) -> Identity | Refusal:
        """The request's tenant from its credential (headers as ASGI sends them;
        ``client_host``: the connection's peer address)."""
        authorizations = _all(headers, b"authorization")
        if len(authorizations) > 1:
            return Refusal(400, f"Authorization must be sent at most once, got "
                                f"{len(authorizations)} values")
        if self.gateway is not None:
            return self._from_gateway(self.gateway, headers, client_host, now)
        if not authorizations or not self.keyed:
            return self._anonymous()
        scheme, _, key = authorizations[0].partition(" ")
        if scheme.lower() != "bearer" or not key:
            return Refusal(401, "Authorization must be 'Bearer <API key>'")
        # the key's bytes as sent (a UTF-8 key matches the UTF-8 of the configured one)
        digest = hashlib.sha256(key.strip().encode("latin-1")).digest()
        match = None
        for grant in self.grants.values():  # every digest compared: no early exit
            if grant.key_digest is not None and hmac.compare_digest(digest, grant.key_digest):
                match = grant
        if match is None:
            return Refusal(401, "the API key matches no tenant")
        return Identity(match.name, "its API key", match)

    def authorize(self, identity: Identity, claimed_tenant: object, priority: int,
                  slo_class: object, slo_allowed: frozenset[str] | None = None
                  ) -> Refusal | None:
        """403 if the request claims another tenant or exceeds its tenant's limits
        (``slo_allowed``: the classes the ``slo`` preset allows it, None: no such limit)."""
        if claimed_tenant is not None and claimed_tenant != identity.tenant:
            return Refusal(403, f"vllm_xargs.tenant {claimed_tenant!r} does not match the "
                                f"tenant {identity.tenant!r} of {identity.credential}")
        grant = identity.grant
        if grant is not None and grant.min_priority is not None \
                and priority < grant.min_priority:
            return Refusal(403, f"priority {priority} is more urgent than tenant "
                                f"{grant.name!r} may ask for (min_priority {grant.min_priority})")
        allowed = grant.slo_classes if grant is not None else None
        if slo_allowed is not None:
            allowed = slo_allowed if allowed is None else allowed & slo_allowed
        return class_refusal(slo_class, allowed,
                             f"tenant {identity.tenant!r} of {identity.credential}")

    def _anonymous(self) -> Identity | Refusal:
        if self.require_credential:
            what = "a gateway tenant header" if self.gateway else "an API key"
            return Refusal(401, f"this server requires {what}")
        grant = self.grants.get(self.anonymous_tenant) or TenantGrant(
            name=self.anonymous_tenant, min_priority=ANONYMOUS_MIN_PRIORITY,
            slo_classes=self.anonymous_slo_classes)  # no keyless entry: the safe default
        return Identity(self.anonymous_tenant, "a request without a credential", grant,
                        anonymous=True)

    def _from_gateway(self, gateway: Gateway, headers: Sequence[tuple[bytes, bytes]],
                      client_host: str | None, now: float) -> Identity | Refusal:
        values = _all(headers, gateway.tenant_header.encode())
        if not values:
            return self._anonymous()
        header = gateway.tenant_header
        if len(values) > 1:
            return Refusal(401, f"{header} must be sent once, got {len(values)} values")
        tenant = values[0]
        if gateway.trusted_sources and not _trusted(gateway.source(client_host, headers),
                                                    gateway.trusted_sources):
            return Refusal(401, f"{header} is only accepted from the gateway")
        if gateway.hmac_key is not None:
            signatures = _all(headers, gateway.signature_header.encode())
            if len(signatures) != 1 or not _signed(tenant, signatures[0], gateway, now):
                return Refusal(401, f"{header} carries no valid, current "
                                    f"{gateway.signature_header}")
        try:
            _check_name(header, tenant)
        except PipelineConfigError as error:
            return Refusal(401, str(error))
        return Identity(tenant, "the gateway's tenant header", self.grants.get(tenant))


def class_refusal(slo_class: object, allowed: frozenset[str] | None, who: str
                  ) -> Refusal | None:
    """403 naming ``allowed`` if ``slo_class`` is not one of them (``who``: for the message;
    None or no class: nothing to refuse)."""
    if allowed is None or slo_class is None or slo_class in allowed:
        return None
    return Refusal(403, f"vllm_xargs.slo_class {slo_class!r} is not allowed for {who} "
                        f"(allowed: {sorted(allowed)})")


def _signed(tenant: str, signature: str, gateway: Gateway, now: float) -> bool:
    """Whether ``signature`` signs ``tenant``, is current and was not accepted before."""
    fields = dict(part.strip().partition("=")[::2] for part in signature.split(","))
    try:
        timestamp = int(fields.get("t", ""))
    except ValueError:
        return False
    if not -gateway.max_future_s <= now - timestamp <= gateway.max_skew_s:
        return False
    expected = sign_tenant(tenant, gateway.hmac_key, timestamp).rpartition("v1=")[2]
    given = fields.get("v1", "").lower()
    if not hmac.compare_digest(expected.encode(), given.encode("latin-1")):
        return False
    return gateway.accept_once(f"{timestamp}.{given}", timestamp, now)


def _trusted(host: str | None, networks: tuple[Network, ...]) -> bool:
    try:
        address = ipaddress.ip_address(host or "")
    except ValueError:
        return False
    return any(address in network for network in networks)


def _all(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> list[str]:
    name = name.lower()
    return [v.decode("latin-1") for k, v in headers if k.lower() == name]


def _check_name(where: str, name: object) -> None:
    try:
        parse_request_metadata(0, {"tenant": name})
    except InvalidRequestMetadata as error:
        raise PipelineConfigError(f"{where}: {error}".replace("vllm_xargs.tenant ", "")) from None


def _tenants_mapping(value: object) -> Mapping[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        value = _read_file(Path(value))
    if not isinstance(value, Mapping):
        raise PipelineConfigError(f"{CONFIG_KEY}.tenants must be a mapping of tenant -> "
                                  f"settings or a file path, got {type(value).__name__}")
    return value


def _read_file(path: Path) -> object:
    if not path.is_file():
        raise PipelineConfigError(f"{CONFIG_KEY}.tenants: file not found: {path}")
    text = path.read_text()
    if path.suffix == ".toml":
        return tomllib.loads(text)
    if path.suffix in (".yaml", ".yml"):
        import yaml  # a vLLM dependency

        return yaml.safe_load(text)
    return json.loads(text)


def _grant(name: str, spec: object, environ: Mapping[str, str]) -> TenantGrant:
    where = f"{CONFIG_KEY}.tenants.{name}"
    _check_name(f"{CONFIG_KEY}.tenants", name)
    if not isinstance(spec, Mapping):
        raise PipelineConfigError(f"{where} must be a mapping, got {type(spec).__name__}")
    if unknown := sorted(set(spec) - _TENANT_FIELDS):
        raise PipelineConfigError(f"{where}: unknown field(s) {unknown}; known: "
                                  f"{sorted(_TENANT_FIELDS)}")
    sources = [key for key in _KEY_SOURCES if spec.get(key) is not None]
    if len(sources) > 1:
        raise PipelineConfigError(f"{where}: give one of {list(_KEY_SOURCES)}, not {sources}")
    digest = _key_digest(where, sources[0], spec[sources[0]], environ) if sources else None
    min_priority = spec.get("min_priority")
    if min_priority is not None:
        try:
            parse_request_metadata(min_priority)
        except InvalidRequestMetadata as error:
            raise PipelineConfigError(f"{where}.min_priority: {error}") from None
    classes = spec.get("slo_classes")
    if classes is not None:
        if isinstance(classes, str) or not isinstance(classes, Sequence):
            raise PipelineConfigError(f"{where}.slo_classes must be a list of class names")
        for slo_class in classes:
            try:
                parse_request_metadata(0, {"slo_class": slo_class})
            except InvalidRequestMetadata as error:
                raise PipelineConfigError(f"{where}.slo_classes: {error}") from None
        classes = frozenset(classes)
    return TenantGrant(name=name, key_digest=digest, min_priority=min_priority,
                       slo_classes=classes)


def _key_digest(where: str, source: str, value: object, environ: Mapping[str, str]) -> bytes:
    if not isinstance(value, str) or not value:
        raise PipelineConfigError(f"{where}.{source} must be a non-empty string")
    if source == "api_key_sha256":
        try:
            digest = bytes.fromhex(value)
        except ValueError:
            digest = b""
        if len(digest) != hashlib.sha256().digest_size:
            raise PipelineConfigError(f"{where}.api_key_sha256 must be 64 hex digits (the "
                                      "key's SHA-256), got "
                                      f"{len(value)} characters")
        return digest
    return hashlib.sha256(_secret(f"{where}.{source}", source, value, environ)).digest()


def _secret(where: str, source: str, value: str, environ: Mapping[str, str]) -> bytes:
    """A key read from the environment variable or file ``value`` names."""
    if source.endswith("_env"):
        secret = environ.get(value, "").strip()
        if not secret:
            raise PipelineConfigError(f"{where}: environment variable {value} is not set")
    else:
        path = Path(value)
        if not path.is_file():
            raise PipelineConfigError(f"{where}: file not found: {value}")
        secret = path.read_text().strip()
        if not secret:
            raise PipelineConfigError(f"{where}: file {value} is empty")
    return secret.encode()


def _gateway(spec: object, environ: Mapping[str, str]) -> Gateway:
    where = f"{CONFIG_KEY}.gateway"
    if not isinstance(spec, Mapping):
        raise PipelineConfigError(f"{where} must be a mapping, got {type(spec).__name__}")
    if unknown := sorted(set(spec) - _GATEWAY_FIELDS):
        raise PipelineConfigError(f"{where}: unknown field(s) {unknown}; known: "
                                  f"{sorted(_GATEWAY_FIELDS)}")
    sources = [key for key in ("hmac_key_env", "hmac_key_file") if spec.get(key) is not None]
    if len(sources) > 1:
        raise PipelineConfigError(f"{where}: give hmac_key_env or hmac_key_file, not both")
    key = (_secret(f"{where}.{sources[0]}", sources[0], spec[sources[0]], environ)
           if sources else None)
    networks, hops = (_networks(f"{where}.{field}", spec.get(field))
                      for field in ("trusted_sources", "forwarded_allow_ips"))
    if key is None and not networks:
        raise PipelineConfigError(f"{where}: set hmac_key_env/hmac_key_file or "
                                  "trusted_sources, else any client could set the tenant")
    skew, future = (_positive_seconds(f"{where}.{field}", spec.get(field, default))
                    for field, default in (("max_skew_s", 60.0), ("max_future_s", 5.0)))
    names = {k: spec.get(k, default) for k, default in
             (("tenant_header", "x-llm-tenant"), ("signature_header", "x-llm-tenant-signature"))}
    for field, name in names.items():
        if not isinstance(name, str) or not name or not name.isascii() or " " in name:
            raise PipelineConfigError(f"{where}.{field} must be an HTTP header name")
    return Gateway(tenant_header=names["tenant_header"].lower(),
                   signature_header=names["signature_header"].lower(), hmac_key=key,
                   trusted_sources=networks, forwarded_allow_ips=hops, max_skew_s=skew,
                   max_future_s=future)


def _networks(where: str, value: object) -> tuple[Network, ...]:
    if isinstance(value, str):
        value = [value]
    try:
        return tuple(ipaddress.ip_network(s, strict=False) for s in value or ())
    except (TypeError, ValueError) as error:
        raise PipelineConfigError(f"{where}: {error}") from None


def _positive_seconds(where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 \
            or value == float("inf"):
        raise PipelineConfigError(f"{where} must be a positive number, got {value!r}")
    return float(value)

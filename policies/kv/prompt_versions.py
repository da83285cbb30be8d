"""`PromptVersions`: which prompt roots a tenant stopped using (cache versioning).

When a tenant rolls out a new system prompt, the blocks of the old one would otherwise squat
in the protected segment of a `policies.kv.eviction.SegmentedLRU`; the order asks this object
which roots went stale and demotes their chains.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import attrs


@attrs.define(eq=False, kw_only=True)
class PromptVersions:
    """Names the prompt roots a tenant stopped using because a new version replaced them.

    A *root* is the first cached block of a request (its system prompt's first block).
    Each request of a tenant is observed with its root and, if the client says, its
    prompt version (``vllm_xargs.prompt_version``). `observe` returns each stale root once:

    * **explicit**: the first request of a tenant with a version it never sent before
      makes the roots of all its earlier versions stale (except this request's root);
    * **implicit** (``stale_after_requests`` set): a root the tenant opened at least
      ``min_uses`` requests with (a shared prompt, not one conversation) is stale once the
      tenant has sent ``stale_after_requests`` requests in a row without it.

    A root another tenant still uses is never stale. Each call is O(1) amortised, with
    at most ``max_roots_per_tenant`` roots tracked per tenant (least recently used dropped).
    """

    stale_after_requests: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))
    """Implicit detection window in the tenant's own requests; ``None``: versions only."""
    min_uses: int = attrs.field(default=8, validator=attrs.validators.ge(1))
    """Requests that must open with a root before implicit detection may call it stale."""
    max_roots_per_tenant: int = attrs.field(default=1024, validator=attrs.validators.ge(1))
    """Roots remembered per tenant (least recently used forgotten, never reported)."""

    _requests: dict[str, int] = attrs.field(init=False, repr=False, factory=dict)
    """Tenant -> its requests observed so far."""
    _roots: dict[str, OrderedDict] = attrs.field(init=False, repr=False, factory=dict)
    """Tenant -> root -> [last request index, uses, version], least recently used first."""
    _versions: dict[str, set] = attrs.field(init=False, repr=False, factory=dict)
    """Tenant -> versions it has sent."""
    _users: dict[Hashable, int] = attrs.field(init=False, repr=False, factory=dict)
    """Root -> tenants tracking it."""

    def observe(self, tenant: str, root: Hashable, version: str | None = None
                ) -> tuple[Hashable, ...]:
        """Record a request of ``tenant`` opening with ``root``; return roots newly stale."""
        index = self._requests[tenant] = self._requests.get(tenant, 0) + 1
        roots = self._roots.setdefault(tenant, OrderedDict())
        record = roots.get(root)
        if record is None:
            record = roots[root] = [index, 0, version]
            self._users[root] = self._users.get(root, 0) + 1
        roots.move_to_end(root)
        record[0], record[1] = index, record[1] + 1
        record[2] = version if version is not None else record[2]
        stale: list[Hashable] = []
        versions = self._versions.setdefault(tenant, set())
        if version is not None and version not in versions:
            if versions:  # a new version rolled out: every root of an older one is stale
                stale += [r for r, (_, _, v) in roots.items() if v is not None and v != version]
            versions.add(version)
        expired: list[Hashable] = []  # unused for a window: forgotten, stale if it was shared
        if self.stale_after_requests is not None:
            for r, (last, uses, _) in roots.items():  # least recently used first
                if index - last <= self.stale_after_requests:
                    break
                expired.append(r)
                if uses >= self.min_uses and r not in stale:
                    stale.append(r)
        for r in dict.fromkeys(stale + expired):
            self._drop(tenant, r)
        while len(roots) > self.max_roots_per_tenant:
            self._drop(tenant, next(iter(roots)))
        return tuple(r for r in stale if r not in self._users)

    def _drop(self, tenant: str, root: Hashable) -> None:
        del self._roots[tenant][root]
        users = self._users[root] - 1
        if users:
            self._users[root] = users
        else:
            del self._users[root]

    def tracked_roots(self, tenant: str) -> tuple[Hashable, ...]:
        """The roots tracked for ``tenant``, least recently used first."""
        return tuple(self._roots.get(tenant, ()))

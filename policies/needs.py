"""`Needs`: what a policy asks of the scheduler beyond its family's calls, declared once.

A policy class states its needs as a class attribute::

    class MyAdmission:
        needs: ClassVar[Needs] = Needs(lifecycle=True, prefix_hits=True)

and the scheduler reads them with `needs_of`, instead of testing each policy for extra
methods. This module sits at the bottom of ``policies``: it imports no policy.
"""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class Needs:
    """The scheduler services a policy uses; each is off unless the policy asks for it."""

    prefix_hits: bool = False
    """Look each arrival's prefix-cache hit up before admission and ranking
    (`RequestView.cached_tokens`)."""
    lifecycle: bool = False
    """Call ``on_admitted``, ``on_first_scheduled`` and ``on_finished``
    (`LifecycleObserver`)."""
    load_at_rank: bool = False
    """Rank with ``rank_key_under_load(view, load)`` instead of ``rank_key(view)``
    (`LoadAwareRanking`); implies ``prefix_hits``."""
    block_quota: bool = False
    """Cap prefill chunks by ``block_quota(view, kv_usage)`` KV blocks (`KVBlockQuota`,
    in the ``watermarks`` slot)."""
    deadlines: bool = False
    """In the ``ranking`` slot, also drop waiting requests that can no longer meet their
    deadline (``is_expired``) and demote late running ones (``is_late``): `DeadlinePolicy`,
    used only while the ``deadlines`` slot is empty."""


NO_NEEDS = Needs()
"""A policy that uses nothing beyond its family's calls."""


def needs_of(policy: object) -> Needs:
    """``policy``'s declared ``needs``; a policy that declares none gets none (`NO_NEEDS`),
    whatever methods it has: the scheduler calls only what a policy asks for.

    Raises:
        TypeError: when ``needs`` is declared but is not a `Needs`.
    """
    needs = getattr(policy, "needs", NO_NEEDS)
    if not isinstance(needs, Needs):
        raise TypeError(f"{type(policy).__name__}.needs must be a policies.Needs, "
                        f"got {needs!r}")
    return needs

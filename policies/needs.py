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


NO_NEEDS = Needs()
"""A policy that uses nothing beyond its family's calls."""

_LIFECYCLE = ("on_admitted", "on_first_scheduled", "on_finished")


def needs_of(policy: object) -> Needs:
    """``policy``'s declared ``needs``; for a policy that declares none, the needs its
    methods imply (lifecycle calls, a ranking under load, a block quota), so policies
    written without a declaration keep working.

    Raises:
        TypeError: when ``needs`` is declared but is not a `Needs`.
    """
    needs = getattr(policy, "needs", None)
    if needs is None:
        return Needs(
            lifecycle=all(callable(getattr(policy, name, None)) for name in _LIFECYCLE),
            load_at_rank=callable(getattr(policy, "rank_key_under_load", None)),
            block_quota=(callable(getattr(policy, "block_quota", None))
                         and callable(getattr(policy, "level", None))))
    if not isinstance(needs, Needs):
        raise TypeError(f"{type(policy).__name__}.needs must be a policies.Needs, "
                        f"got {needs!r}")
    return needs

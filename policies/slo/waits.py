"""`CapacityWaits`: when the KV cache and a running slot have room for a new request beside
the admitted ones."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

from policies.slo.feasibility import freed_by_s, slots_free_s
from policies.slo.ledger import PrefillLedger
from policies.step_model import OnlineStepTimeModel, StepTimeModel
from policies.views import LoadSnapshot, RequestView


@attrs.define(eq=False, kw_only=True)
class CapacityWaits:
    """When KV and a slot are free for a new request, from the admitted requests' expected
    releases (`PrefillLedger.kv_releases`) at the step time measured lately (else the
    model's full step) a token.

    Guarantees: ``now`` whenever there is room already or the capacity is unknown; ``inf``
    when the admitted requests cannot free enough; between `hold` and `release` (one
    admission decision, while the ledger stands still) the releases are sorted once.
    """

    ledger: PrefillLedger
    step_model: StepTimeModel | OnlineStepTimeModel
    rate_and_step: Callable[[LoadSnapshot], tuple[float, float]]
    """``(prefill tokens/s, step seconds)`` of a step under a load."""
    finish_window_s: float
    """The longest first-token target: the wait for a slot is planned at most that far
    ahead, so the slot-release rate is measured over as long."""

    _held: tuple[LoadSnapshot, dict[str, Any]] | None = attrs.field(
        init=False, default=None, repr=False)
    """Between `hold` and `release`: the load and what was computed under it (the KV
    releases, the slot-release rate)."""

    def hold(self, load: LoadSnapshot) -> None:
        """Compute the releases and read the slot-release rate at most once until `release`
        (the ledger stands still)."""
        self._held = (load, {})

    def release(self) -> None:
        """Stop memoizing."""
        self._held = None

    def kv_ready_s(self, request: RequestView, load: LoadSnapshot) -> float:
        """When the KV cache has room for ``request`` beside what is admitted: now, if the
        admitted requests' prompts and expected outputs leave room for its own; else when
        enough admitted requests will have finished; ``inf`` if they cannot free enough.
        ``now`` when the capacity is unknown."""
        capacity = load.kv_capacity_tokens
        footprint = request.prompt_tokens + self.ledger.expected_output_tokens(request)
        need = self.ledger.kv_demand_tokens + footprint - (capacity or 0)
        if capacity is None or need <= 0:
            return load.now
        return freed_by_s(self._releases(load), need)

    def slot_ready_s(self, load: LoadSnapshot, ahead: int, arriving: float = 0.0) -> float:
        """When a slot is free for a request with ``ahead`` admitted, unstarted requests and
        ``arriving`` requests still to arrive before it in EDF order: now while the running
        requests and those leave a slot (or when the slot count is unknown); else
        `slots_free_s`, from the expected finishes (as in `kv_ready_s`) and
        `PrefillLedger.finish_rate`."""
        need = (load.running_requests + ahead + arriving + 1
                - (load.max_running_requests or math.inf))
        if need <= 0:
            return load.now
        return slots_free_s(load.now, need, self._releases(load), self._finish_rate(load),
                            arriving=arriving)

    def _finish_rate(self, load: LoadSnapshot) -> float:
        """`PrefillLedger.finish_rate` over ``finish_window_s``, read once per held decision
        (a settled slot wait asks for it at every bisection step)."""
        return self._once(load, "finish_rate",
                          lambda: self.ledger.finish_rate(load.now, self.finish_window_s))

    def _releases(self, load: LoadSnapshot) -> list[tuple[float, float]]:
        def releases() -> list[tuple[float, float]]:
            rate, step_s = self.rate_and_step(load)
            tpot_s = getattr(self.step_model, "recent_step_s", None) or step_s
            return self.ledger.kv_releases(load.now, tpot_s, rate)

        return self._once(load, "releases", releases)

    def _once(self, load: LoadSnapshot, name: str, compute: Callable[[], Any]) -> Any:
        """``compute()``, kept under ``name`` while ``load`` is held."""
        held = self._held
        if held is None or held[0] is not load:
            return compute()
        if name not in held[1]:
            held[1][name] = compute()
        return held[1][name]

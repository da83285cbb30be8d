"""`StepRoom`: the prefill a step may carry so that it stays within the TPOT of the classes
decoding, as a per-step token cap."""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs

from policies.slo.ledger import PrefillLedger
from policies.step_model import OnlineStepTimeModel, StepTimeModel
from policies.validators import at_least
from policies.views import LoadSnapshot, RequestView


def tokens_within(room_s: float, context_tokens: int, model: StepTimeModel) -> float:
    """The prefill tokens after ``context_tokens`` in KV that ``model`` runs in ``room_s``
    (0 when there is no room): the root of its linear-plus-pairs prefill cost."""
    if room_s <= 0:
        return 0.0
    linear = model.prefill_s_per_token + model.prefill_s_per_pair * (context_tokens + 0.5)
    quadratic = model.prefill_s_per_pair / 2
    if quadratic > 0:
        return (math.sqrt(linear * linear + 4 * quadratic * room_s) - linear) / (2 * quadratic)
    return room_s / linear



@attrs.define(eq=False, kw_only=True)
class StepRoom:
    """The most prefill tokens a step may carry so that it stays within the TPOT bound in
    force (``tpot_bound_s``: the tightest target of the classes decoding, times the TPOT
    headroom) on the step model, beside the decodes the ledger knows of.

    A token-cap policy (`token_cap`) for `StepPrefillBudget`'s ``bound``. Guarantees: the
    whole token budget when no TPOT bound is in force; never fewer than ``floor_tokens``
    (the floor that keeps prefill moving; 1 when None) nor more than the token budget; the
    room is priced once per step (per `LoadSnapshot`), and each chunk capped in a step is
    charged at its own context. O(1) per chunk.
    """

    step_model: StepTimeModel | OnlineStepTimeModel
    """The step time (a learned model is read at its current fit)."""
    ledger: PrefillLedger
    """The requests decoding (their context is part of every step)."""
    tpot_bound_s: Callable[[], float]
    """The TPOT every step must stay within now (``inf``: none)."""
    floor_tokens: int | None = attrs.field(default=None,
                                           validator=attrs.validators.optional(at_least(1)))
    """Prefill tokens a step may always carry (None: 1)."""

    _priced: tuple[LoadSnapshot, float, StepTimeModel] | None = attrs.field(
        init=False, default=None, repr=False)
    """This step's prefill room and the model it was priced on (`_room`)."""
    _spent: list | None = attrs.field(init=False, default=None, repr=False)
    """[this step's load, seconds of its room its chunks' caps took, their tokens]
    (`token_cap`)."""

    def prefill_tokens(self, load: LoadSnapshot, context_tokens: int) -> int:
        """The most prefill tokens, after ``context_tokens`` in KV, one step of ``load`` may
        carry within the bound; the whole token budget when there is none; never fewer
        than the floor."""
        room_s, model = self._room(load)
        if room_s == math.inf:
            return load.token_budget
        return int(min(max(tokens_within(room_s, context_tokens, model), self._floor(load)),
                       load.token_budget))

    def _floor(self, load: LoadSnapshot) -> int:
        return min(self.floor_tokens or 1, load.token_budget)

    def _room(self, load: LoadSnapshot) -> tuple[float, StepTimeModel]:
        """Seconds a step of ``load`` has for prefill beside its decodes (``inf`` when no
        bound is in force) and the model it was priced on; once per step, for every prefill
        request's cap in it."""
        priced = self._priced
        if priced is not None and priced[0] is load:
            return priced[1], priced[2]
        model = getattr(self.step_model, "model", self.step_model)
        room_s = self.tpot_bound_s()
        if room_s != math.inf:
            room_s -= model.step_s(load.running_requests, 0, self.ledger.decoding_context_tokens)
        self._priced = (load, room_s, model)
        return room_s, model

    def token_cap(self, request: RequestView, load: LoadSnapshot) -> int:
        """A per-step bound for `StepPrefillBudget`'s ``bound`` (which subtracts, in tokens,
        what it has granted this step): the tokens this step's earlier chunks were allowed,
        plus as many as fit, after ``request``'s context, in the room those chunks left at
        their own contexts; never below the floor. Pricing each chunk at its own context
        keeps a chunk after a short context from taking the room a chunk after a long one
        has spent: counted in tokens alone, such steps overshot the room
        (``mooncake-synthetic``: steps of 118 ms against 90 ms)."""
        room_s, model = self._room(load)
        if room_s == math.inf:
            return load.token_budget
        spent = self._spent
        if spent is None or spent[0] is not load:
            spent = self._spent = [load, 0.0, 0]
        context = max(request.computed_tokens, request.cached_tokens)
        granted = spent[2]
        limit = int(min(max(granted + tokens_within(room_s - spent[1], context, model),
                            self._floor(load)), load.token_budget))
        take = max(min(limit - granted, request.prompt_tokens - context), 0)
        spent[1] += model.prefill_token_equivalents(take, context) * model.prefill_s_per_token
        spent[2] += take
        return limit

    def on_scheduled(self, request: RequestView, tokens: int, now: float) -> None:
        """Nothing to learn: the room is priced from the model and the ledger."""

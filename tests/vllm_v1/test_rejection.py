"""`Rejection`: one typed value from the scheduler's stop reason to the HTTP answer."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from integrations.vllm_v1.rejection import Rejection
from policies import AdmissionDecision

reasons = st.from_regex(r"[a-z_]{1,20}", fullmatch=True)
details = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
retries = st.floats(0, 1e6, allow_nan=False).map(lambda s: float(f"{s:g}"))


@given(reason=reasons, detail=details, retry=retries)
def test_the_stop_reason_decodes_to_the_same_rejection(reason, detail, retry):
    rejection = Rejection(reason=reason, detail=detail, retry_after_s=retry)
    assert Rejection.parse(rejection.stop_reason) == rejection


@given(reason=reasons, detail=details.filter(lambda d: d == d.strip() and ";" not in d))
def test_the_http_message_decodes_to_the_same_reason_and_detail(reason, detail):
    rejection = Rejection(reason=reason, detail=detail, retry_after_s=3.0)
    assert Rejection.from_message(rejection.message, 3.0) == rejection


def test_an_admission_decision_splits_into_reason_and_detail():
    rejection = Rejection.from_decision(AdmissionDecision.reject("class_full:gold", 2.5))
    assert (rejection.reason, rejection.detail, rejection.retry_after_s) == ("class_full", "gold", 2.5)
    assert rejection.stop_reason == "rejected:class_full:gold;retry_after_s=2.5"


@pytest.mark.parametrize(("reason", "status", "retry_after"), [
    ("invalid_metadata", 400, None),   # retrying cannot help: no Retry-After
    ("class_full", 429, "3"),          # the client's own quota
    ("queue_full", 503, "3"),          # overload
    ("kv_red", 503, "3"),
])
def test_status_codes_say_whose_problem_it_is(reason, status, retry_after):
    rejection = Rejection(reason=reason, retry_after_s=2.1)
    assert rejection.http_status == status
    assert rejection.retry_after_header == retry_after


def test_other_stop_reasons_are_not_rejections():
    for stop in (None, 7, "stop", "rejected:queue_full", "rejected:Bad;retry_after_s=1"):
        assert Rejection.parse(stop) is None

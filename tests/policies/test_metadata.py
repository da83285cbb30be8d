"""Validation of client-supplied scheduling metadata."""

import pytest

from policies import DEFAULT_TENANT, InvalidRequestMetadata, parse_request_metadata


def test_defaults_when_nothing_is_given():
    metadata = parse_request_metadata()
    assert (metadata.priority, metadata.tenant, metadata.slo_class, metadata.deadline_ms) == (
        0, DEFAULT_TENANT, None, None)


def test_valid_metadata_is_kept():
    metadata = parse_request_metadata(-3, {"tenant": "acme", "slo_class": "gold",
                                           "deadline_ms": 1500, "other": [1, 2]})
    assert (metadata.priority, metadata.tenant, metadata.slo_class, metadata.deadline_ms) == (
        -3, "acme", "gold", 1500.0)


@pytest.mark.parametrize(
    ("priority", "extra_args", "message"),
    [
        (21, None, "priority must be between -20 and 20"),
        (-21, None, "priority must be between -20 and 20"),
        ("high", None, "priority must be an integer"),
        (True, None, "priority must be an integer"),
        (0, {"tenant": ""}, "vllm_xargs.tenant must be a string"),
        (0, {"tenant": 7}, "vllm_xargs.tenant must be a string"),
        (0, {"tenant": "a b"}, "vllm_xargs.tenant must be a string"),
        (0, {"slo_class": ["gold"]}, "vllm_xargs.slo_class must be a string"),
        (0, {"deadline_ms": -5}, "deadline_ms must be a positive finite number"),
        (0, {"deadline_ms": float("inf")}, "deadline_ms must be a positive finite number"),
        (0, {"deadline_ms": "soon"}, "deadline_ms must be a number"),
    ],
)
def test_invalid_metadata_names_the_field(priority, extra_args, message):
    with pytest.raises(InvalidRequestMetadata, match=message):
        parse_request_metadata(priority, extra_args)

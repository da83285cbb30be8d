"""The business case's systems as an operator declares them."""

from benchmarks.e2e_business_cases.systems import slo_pipeline
from benchmarks.replay.enterprise import TENANTS
from integrations.vllm_v1.config.spec import CONFIG_KEY, served_slo, to_additional_config
from integrations.vllm_v1.serving.http_validation import check_request
from integrations.vllm_v1.serving.routes import EngineRoute
from integrations.vllm_v1.serving.tenants import TenantBinding

COMPLETIONS = EngineRoute(path="/v1/completions", reads_priority=True, reads_xargs=True)


def door_status(entry, tenant, slo_class):
    body = {"prompt": "Hi", "vllm_xargs": {"tenant": tenant, "slo_class": slo_class}}
    return check_request(body, [], COMPLETIONS, binding=TenantBinding.from_entry(entry),
                         slo=served_slo(entry)).status


def test_served_over_http_each_tenant_may_claim_its_own_tiers_classes_only():
    entry = to_additional_config(slo_pipeline())[CONFIG_KEY]  # as serve() hands it over
    for tenant in TENANTS:
        for tier in ("gold", "silver", "bronze"):
            expected = 0 if tier == tenant.tier else 403
            assert door_status(entry, tenant.name, f"{tier}-chat") == expected, (tenant, tier)

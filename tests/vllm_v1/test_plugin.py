"""The vLLM plugin: installed as a ``vllm.general_plugins`` entry point, and its names
resolve through vLLM's own factories."""

from importlib.metadata import entry_points


def test_the_plugin_is_an_installed_vllm_entry_point():
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert plugins["llm_serving_policies"] == "integrations.vllm_v1.plugin:register"


def test_register_makes_vllm_load_our_connector_and_cache_policy_by_name():
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    from integrations.vllm_v1.cache.offload_policy import SegmentedLRUCachePolicy
    from integrations.vllm_v1.cache.tiers.connector import KVTierConnector
    from integrations.vllm_v1.plugin import register

    register()
    register()  # idempotent: vLLM may load plugins more than once per process
    assert KVConnectorFactory._registry["KVTierConnector"]() is KVTierConnector
    assert CachePolicyFactory.get_cache_policy_cls("segmented_lru") is SegmentedLRUCachePolicy

"""The tiered connector's pieces that need no engine: block store, paged copies, config, metrics."""

import pytest
import torch

from integrations.vllm_v1.cache.tiers.config import KVTierConfig
from integrations.vllm_v1.cache.tiers.store import CPU, DISK, KVBlockStore, PagedKV


def block(value):
    return (torch.full((2, 3), float(value)), torch.full((4,), float(value)))


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_store_moves_blocks_between_memory_and_disk(tmp_path):
    store = KVBlockStore(str(tmp_path))
    store.put(b"\x01", block(1))
    store.move(b"\x01", CPU, DISK)
    assert (store.blocks(CPU), store.blocks(DISK)) == (0, 1)
    assert (tmp_path / "01.pt").exists()
    assert same(store.get(b"\x01"), block(1))
    store.move(b"\x01", DISK, CPU)
    assert not (tmp_path / "01.pt").exists()
    assert same(store.get(b"\x01"), block(1))
    store.move(b"\x01", CPU, None)
    assert store.get(b"\x01") is None
    store.move(b"\x01", CPU, DISK)  # already gone: skipped
    assert store.blocks(DISK) == 0


def test_a_lost_disk_file_reads_as_missing(tmp_path):
    store = KVBlockStore(str(tmp_path))
    store.put(b"\x02", block(2))
    store.move(b"\x02", CPU, DISK)
    (tmp_path / "02.pt").unlink()
    assert store.get(b"\x02") is None


def test_a_temporary_directory_is_removed_on_close():
    store = KVBlockStore(None)
    directory = store.directory
    store.put(b"\x03", block(3))
    store.move(b"\x03", CPU, DISK)
    store.close()
    assert not directory.exists()


@pytest.mark.parametrize("shape", [(6, 2, 4, 8), (2, 6, 4, 8), (12, 2, 4, 8)],
                         ids=["blocks-first", "kv-first", "two-kernel-blocks-per-block"])
def test_paged_copies_round_trip_whole_blocks(shape):
    torch.manual_seed(0)
    source = {"layer.0": torch.randn(shape), "layer.1": torch.randn(shape)}
    target = {name: torch.zeros(shape) for name in source}
    blocks = PagedKV(source, num_blocks=6).read([4, 1])
    PagedKV(target, num_blocks=6).write([0, 5], blocks)
    again = PagedKV(target, num_blocks=6).read([0, 5])
    assert all(same(a, b) for a, b in zip(blocks, again, strict=True))
    untouched = PagedKV(target, num_blocks=6).read([2])[0]
    assert all(not t.any() for t in untouched)


def test_paged_copies_reject_a_tensor_without_a_block_dimension():
    with pytest.raises(ValueError, match="has no dimension of 7 blocks"):
        PagedKV({"layer.0": torch.zeros(2, 3, 4)}, num_blocks=7)


def test_config_round_trips_through_the_transfer_config():
    config = KVTierConfig(cpu_blocks=8, disk_blocks=16, high_priority_at_most=0)
    transfer = config.transfer_config()
    assert transfer["kv_connector"] == "KVTierConnector"
    assert transfer["kv_connector_module_path"] == "integrations.vllm_v1.cache.tiers.connector"
    assert KVTierConfig.from_extra_config(transfer["kv_connector_extra_config"]) == config
    with pytest.raises(ValueError, match="kv_transfer_config is set by KVTierConfig"):
        config.engine_kwargs(kv_transfer_config={})
    with pytest.raises(ValueError, match="cpu_blocks"):
        KVTierConfig(cpu_blocks=0)

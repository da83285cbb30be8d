"""The metrics folder a hard-killed serve command left behind is removed by the next one."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from integrations.vllm_v1.metrics import MULTIPROC_ENV
from integrations.vllm_v1.serving.server import METRICS_DIR_PREFIX, new_metrics_dir


def test_a_folder_whose_creator_died_is_removed_and_a_live_ones_kept(monkeypatch):
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)
    left = Path(tempfile.mkdtemp(prefix=f"{METRICS_DIR_PREFIX}{dead}-"))
    (left / "counter_1.db").write_bytes(b"x")
    alive = Path(tempfile.mkdtemp(prefix=f"{METRICS_DIR_PREFIX}{os.getpid()}-"))
    fresh = new_metrics_dir()
    try:
        assert not left.exists()
        assert alive.is_dir()
        assert Path(fresh).name.startswith(f"{METRICS_DIR_PREFIX}{os.getpid()}-")
    finally:
        shutil.rmtree(alive, ignore_errors=True)
        shutil.rmtree(fresh, ignore_errors=True)
        shutil.rmtree(left, ignore_errors=True)

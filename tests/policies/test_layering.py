"""`policies` must stay pure Python: importing it loads no vLLM and no torch."""

import subprocess
import sys


def test_importing_policies_loads_no_vllm_or_torch():
    code = (
        "import sys, policies\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'vllm', 'torch'})\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == ""


def test_public_api_is_exported():
    import policies

    for name in policies.__all__:
        assert hasattr(policies, name), name

"""`import policies` must not load numba: vLLM 0.32's workers crash scanning ``sys.modules``
when llvmlite is already imported, and spawned workers re-import a script's top-level imports."""

import subprocess
import sys


def test_importing_the_library_does_not_import_numba():
    code = ("import sys, policies, integrations.vllm_v1; "
            "from policies.speculative import SuffixDrafter; "
            "assert 'numba' not in sys.modules and 'llvmlite' not in sys.modules; "
            "SuffixDrafter().start('r', [1, 2, 1, 2]); assert 'numba' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)

"""``python -m integrations.vllm_v1.serving``: see `integrations.vllm_v1.serving.cli`."""

import sys

from integrations.vllm_v1.serving.cli import main

sys.exit(main())

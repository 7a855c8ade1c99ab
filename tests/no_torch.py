"""A script that runs `trainforge` with torch made unimportable and reports the torch modules that got loaded
(`TORCH_MODULES=[...]` on stderr): the serving path must not need torch (tests/compression, tests/perception3d)."""

NO_TORCH = """\
import json, sys
sys.modules["torch"] = None  # any `import torch` from here on raises ImportError
from trainforge.cli import main
code = 0
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code or 0
loaded = sorted(m for m, mod in sys.modules.items() if m.startswith("torch") and mod is not None)
sys.stderr.write("TORCH_MODULES=" + json.dumps(loaded) + "\\n")
sys.exit(code)
"""

#!/usr/bin/env python3
"""WMT 2014 English-French: the paper's data, training, averaging, decoding and scoring.

See README.md next to this file. Quick checks: `--dry-run` prints every command; `--tiny`
runs the whole chain on the shipped fixtures in seconds.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.wmt14 import EN_FR, main  # noqa: E402

if __name__ == "__main__":
    main(EN_FR, "wmt14_en_fr/run.py")

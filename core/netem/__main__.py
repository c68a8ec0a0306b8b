"""``python -m pathprobe.netem --listen H:P --upstream H:P --delay-ms D`` (same as ``pathprobe netem``)."""

import sys

from pathprobe.netem.cli import main

sys.exit(main())

import sys

from pathprobe.cli import main

sys.exit(main())

import sys

from pathprobe.proxies import main

sys.exit(main())

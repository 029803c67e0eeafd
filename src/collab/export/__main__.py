"""``python -m collab.export``: the command's exit code is the process's."""

import sys

from collab.export import main

sys.exit(main())

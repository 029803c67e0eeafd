import sys

from collab.compare import main

sys.exit(main())

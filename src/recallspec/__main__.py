import sys

from recallspec.cli import main

sys.exit(main())

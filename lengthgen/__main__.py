import sys

from lengthgen.cli import main

sys.exit(main())

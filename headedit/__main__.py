import sys

from headedit.cli import main

sys.exit(main())

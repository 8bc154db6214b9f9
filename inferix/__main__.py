import sys

from inferix.cli.main import main

sys.exit(main())

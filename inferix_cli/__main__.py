import sys

from inferix_cli.main import main

sys.exit(main())

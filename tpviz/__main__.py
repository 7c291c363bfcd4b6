import sys

from tpviz.cli import main

sys.exit(main())

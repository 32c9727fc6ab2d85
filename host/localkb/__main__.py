import sys

from localkb.cli import main

sys.exit(main())

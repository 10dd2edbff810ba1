"""``python -m kvldp``: the ``kvldp`` command."""
import sys

from kvldp.runtime.start import main

sys.exit(main())

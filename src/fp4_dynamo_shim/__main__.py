"""python -m fp4_dynamo_shim: the command line (``fp4_dynamo_shim.cli``)."""

import sys

from fp4_dynamo_shim.cli import main

if __name__ == "__main__":
    sys.exit(main())

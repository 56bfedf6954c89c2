"""python -m fp4_dynamo_shim: the command line (``_fp4_dynamo_shim.cli``)."""

import sys

from _fp4_dynamo_shim.cli import main

if __name__ == "__main__":
    sys.exit(main())

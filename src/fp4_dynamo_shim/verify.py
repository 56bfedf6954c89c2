"""python -m fp4_dynamo_shim.verify: the installation check (``_fp4_dynamo_shim.verify.report``)."""

import sys

from _fp4_dynamo_shim.verify.report import main

if __name__ == "__main__":
    sys.exit(main())

"""python -m fp4_dynamo_shim.verify: the installation check, ``fp4-dynamo-shim verify`` (``_fp4_dynamo_shim.cli``)."""

import sys

from _fp4_dynamo_shim import cli


def main(argv=None) -> int:
    return cli.main(["verify", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())

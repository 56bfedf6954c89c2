"""run_engine.py, started the way the README's first usage starts SGLang: ``import fp4_dynamo_shim`` first."""

import fp4_dynamo_shim  # noqa: F401  (the route under test: the import applies the shim and exports it)

import sys

import run_engine

if __name__ == "__main__":
    sys.exit(run_engine.main())

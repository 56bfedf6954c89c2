"""verify's text report as the words it prints, for a status and an environment given.

``python -m fp4_dynamo_shim.verify`` prints this machine's report; the words for another machine's (two GPUs, a GPU
record, a failed check) are asked of the report's printer itself, which is what main calls.
"""

from __future__ import annotations

import contextlib
import io

from _fp4_dynamo_shim.verify import report

print_report = report._print_text


def text(environment: dict, status: dict, results=(), exit_code: int = 0, verbose: bool = False) -> str:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        print_report(environment, status, list(results), exit_code, verbose=verbose)
    return out.getvalue()


def flashinfer_ops_line(environment: dict, status: dict) -> str:
    """The report's line for FlashInfer's declared ops."""
    return next(line for line in text(environment, status).splitlines() if line.startswith("  flashinfer ops"))


def rebound_lines(environment: dict, status: dict, verbose: bool) -> list:
    """The report's lines under "names rebound"."""
    lines = text(environment, status, verbose=verbose).splitlines()
    start = next(i for i, line in enumerate(lines) if " names rebound" in line) + 1
    return [line for line in lines[start:] if line.startswith("    ")]

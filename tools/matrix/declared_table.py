"""Write tests/data/declared_releases.json: for each FlashInfer release of the matrix, what the shim does with every
op FlashInfer declares (``FP4_DYNAMO_SHIM_FLASHINFER_OPS=all``): the op it registers, or the kind of reason and
the reason it does not.

Each release is installed into a directory of its own and put first on the path (as run_matrix.py does), the
shim applied in a fresh interpreter (with the GPU-query stand-in for the releases that need it to import on
CPU), and ``status()["flashinfer_ops"]`` recorded; this environment is not changed.
``tests/declared/test_declared_ops_trace_on_cpu.py`` checks the installed release's row against the live shim (the matrix runs it for
each release) and counts the declarations in the installed wheel's text, independently of the ast scan.

    python tools/matrix/declared_table.py                       # every release of the matrix
    python tools/matrix/declared_table.py --versions 0.6.12     # update one row
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from packaging.version import Version

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_matrix  # noqa: E402

TABLE = run_matrix.ROOT / "tests" / "data" / "declared_releases.json"
PROBE = """
import json, os, warnings
warnings.filterwarnings("ignore")
os.environ["FP4_DYNAMO_SHIM_FLASHINFER_OPS"] = "all"
import fp4_dynamo_shim
import torch._dynamo  # the layer applies when Dynamo is imported, as it is before anything compiles
status = fp4_dynamo_shim.status()
layer = status["flashinfer_ops"] or {}
print(json.dumps({"applied": status["applied"], "problem": status["problem"],
                  "registered": layer.get("registered"), "not_registered": layer.get("not_registered"),
                  "counts": layer.get("counts")}))
"""


def probe(site: run_matrix.Site) -> dict:
    version = site.version
    if site.import_error() is not None:
        site = dataclasses.replace(site, stand_in=True)
    completed = site.run(PROBE)
    if completed.returncode != 0:
        raise SystemExit(f"flashinfer {version}: the probe failed:\n{completed.stderr[-3000:]}")
    row = json.loads(completed.stdout.strip().splitlines()[-1])
    if not row["applied"]:
        raise SystemExit(f"flashinfer {version}: the shim did not apply: {row['problem']}")
    return {"counts": row["counts"], "registered": row["registered"], "not_registered": row["not_registered"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="+",
                        default=[*run_matrix.VERSIONS, *(v for v, _ in run_matrix.OTHER_TORCH)])
    options = parser.parse_args()
    table = json.loads(TABLE.read_text()) if TABLE.exists() else {"releases": {}}
    table["generated_by"] = "python tools/matrix/declared_table.py"
    with tempfile.TemporaryDirectory() as scratch:
        wheels = Path(scratch) / "wheels"
        run_matrix.download(options.versions, wheels)
        for version in options.versions:
            table["releases"][version] = probe(run_matrix.install(version, wheels, Path(scratch)))
            print(f"flashinfer {version}: {json.dumps(table['releases'][version]['counts'])}", flush=True)
    table["releases"] = {version: table["releases"][version] for version in sorted(table["releases"], key=Version)}
    TABLE.write_text(json.dumps(table, indent=1, sort_keys=False) + "\n")
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

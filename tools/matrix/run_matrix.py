"""Run the release-sensitive CPU tests against every FlashInfer release an SGLang 0.5.x release pins; write the table.

Each leg gets its own copy of one FlashInfer release (``pip install --no-deps --target`` from wheels downloaded
once) first on ``PYTHONPATH``: the environment itself is never changed, so legs run two at a time (``--jobs``).
Every leg uses this environment's dependencies except the legs of ``OTHER_TORCH``, which get a virtual
environment with that torch (SGLang 0.5.23's pins). One real release below the range must be refused cleanly.
A leg runs the test files of ``CHECKS`` less the tests marked ``release_independent``: those whose outcome
depends on the installed release (docs/testing.md says which and why).

    python tools/matrix/run_matrix.py --output docs/compatibility.md           # regenerate
    python tools/matrix/run_matrix.py --output docs/compatibility.md --check   # CI: fail if stale

Exit status 1 when any check of a supported release fails, when the unsupported release is not
refused cleanly, or (with --check) when the committed table differs from this run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

from compatibility import check_files, read_leg, render
import cores  # noqa: E402  (in tools/, on the path since compatibility's import)

ROOT = Path(__file__).resolve().parents[2]

#: FlashInfer releases pinned by SGLang 0.5.x releases, oldest first, on this environment's torch, and the highest
#: release the registry offers, whatever its number (``newest_release``); those of ``OTHER_TORCH`` run there only.
VERSIONS = ["0.5.3", "0.6.1", "0.6.3", "0.6.7.post2", "0.6.8.post1", "0.6.11.post1", "0.6.12", "0.6.15.post1",
            "0.6.18", "0.7.1", "0.7.4"]
#: (FlashInfer, torch) legs on a torch other than this environment's: the pins of SGLang 0.5.23.
OTHER_TORCH = [("0.7.2", "2.14.1")]
#: A real release outside the supported range: it must be refused with one clear warning.
UNSUPPORTED = ["0.5.2"]
REFUSAL_PROBE = """
import json, logging, io
stream = io.StringIO(); logging.basicConfig(stream=stream, level=logging.WARNING)
import fp4_dynamo_shim, flashinfer
status = fp4_dynamo_shim.status()
untouched = not getattr(flashinfer.fp4_quantize, "__fp4_dynamo_shim__", False)
print(json.dumps({"applied": status["applied"], "problem": status["problem"], "untouched": untouched,
                  "warnings": [l for l in stream.getvalue().splitlines() if "not supported" in l]}))
"""

LEG_PROBE = """
import json, traceback, torch
report = {"torch": torch.__version__, "import_error": None}
try:
    import flashinfer
except Exception as error:
    lines = [line for line in "".join(traceback.format_exception_only(type(error), error)).splitlines() if line.strip()]
    report["import_error"] = lines[-1]
print(json.dumps(report))
"""

STAND_IN = ROOT / "tools" / "matrix" / "gpu_query_stand_in"


def pip(*arguments: str, python: str = sys.executable, attempts: int = 1) -> None:
    """pip, its output kept; a failure raises with the output's end, which is where CI's log shows it (the
    legs' threads report their errors after every other leg's lines). ``attempts``: for a step that reaches the
    registry for many packages, where one fetch that fails is no fault of the project."""
    for attempt in range(1, attempts + 1):
        completed = subprocess.run([python, "-m", "pip", "-q", *arguments], capture_output=True, text=True)
        if completed.returncode == 0:
            return
        tail = (completed.stdout + completed.stderr)[-3000:]
        if attempt < attempts:
            print(f"pip {' '.join(arguments)} failed (attempt {attempt} of {attempts}), again:\n{tail}", flush=True)
    raise SystemExit(f"pip {' '.join(arguments)} failed (exit {completed.returncode}):\n{tail}")


def newest_release(wheels: Path) -> str:
    """The highest flashinfer-python the registry offers (its wheel is left in ``wheels``)."""
    folder = wheels / "newest"
    pip("download", "--no-deps", "--only-binary=:all:", "-d", str(folder), "flashinfer-python")
    (wheel,) = folder.glob("flashinfer_python-*.whl")
    wheels.joinpath(wheel.name).exists() or wheel.rename(wheels / wheel.name)
    return wheel.name.split("-")[1]


def release_parts(site: "Site") -> dict:
    """``tools/release_parts.py --json`` over the leg's release: what the shim would do were it newer than tested."""
    completed = subprocess.run([site.python, str(ROOT / "tools" / "release_parts.py"), "--json"], cwd=ROOT,
                               capture_output=True, text=True, env=site.environment())
    if completed.returncode != 0:
        return {"error": completed.stderr[-1500:]}
    return json.loads(completed.stdout.strip().splitlines()[-1])


def download(versions, wheels: Path) -> None:
    """Each release's wheel, once, for every leg that installs it (four downloads at once)."""
    missing = [v for v in dict.fromkeys(versions) if not list(wheels.glob(f"flashinfer_python-{v}-*.whl"))]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        for done in [pool.submit(pip, "download", "--no-deps", "--only-binary=:all:", "-d", str(wheels / version),
                                 f"flashinfer-python=={version}") for version in missing]:
            done.result()
    for version in missing:
        for wheel in (wheels / version).glob("*.whl"):
            wheel.rename(wheels / wheel.name)


@dataclasses.dataclass
class Site:
    """One FlashInfer release, first on the path of the interpreter ``python`` (this one by default)."""

    version: str
    directory: Optional[Path] = None  # the release's --target directory; None: the interpreter's own
    python: str = sys.executable
    stand_in: bool = False  # the release needs the GPU-query stand-in to import on CPU

    def environment(self, **extra) -> dict:
        paths = [str(self.directory)] if self.directory else []
        if self.stand_in:
            paths.append(str(STAND_IN))
        paths.append(os.environ.get("PYTHONPATH", ""))
        environment = {**os.environ, **extra}
        environment.pop("PYTEST_ADDOPTS", None)
        environment["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        return environment

    def run(self, code: str, **extra) -> subprocess.CompletedProcess:
        return subprocess.run([self.python, "-c", code], cwd=ROOT, capture_output=True, text=True,
                              env=self.environment(**extra))

    def probe(self) -> dict:
        """torch's version and why ``import flashinfer`` fails here, or None (some releases need a GPU to
        import): one interpreter, since each start imports torch and FlashInfer."""
        completed = self.run(LEG_PROBE)
        if completed.returncode != 0:
            raise SystemExit(f"flashinfer {self.version}: the probe failed:\n{completed.stderr[-2000:]}")
        return json.loads(completed.stdout.strip().splitlines()[-1])

    def import_error(self) -> Optional[str]:
        return self.probe()["import_error"]


def install(version: str, wheels: Path, scratch: Path) -> Site:
    directory = scratch / f"flashinfer-{version}"
    # --no-compile: pip byte-compiles every module of the release otherwise (0.7.4's wheel: 30 s against 7 s
    # without); the leg compiles only the modules it imports
    pip("install", "--no-deps", "--no-index", "--no-cache-dir", "--no-compile", "--find-links", str(wheels),
        "--target", str(directory), f"flashinfer-python=={version}")
    site = Site(version, directory)
    found = site.run("import importlib.metadata as m; print(m.version('flashinfer-python'))").stdout.strip()
    if found != version:  # the leg would test another release than it says
        raise SystemExit(f"{directory}: the leg's interpreter finds flashinfer-python {found!r}, not {version}")
    return site


def torch_environment(version: str, torch: str, scratch: Path) -> Site:
    """A virtual environment with ``torch`` and this FlashInfer release installed with its dependencies, and
    the project with its test dependencies (torch first: any other order lets pip pick another torch)."""
    root = scratch / f"torch-{torch}"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    python = str(root / "bin" / "python")
    # --no-compile: the leg compiles the modules it imports, not the thousands of torch and FlashInfer it never does
    pip("install", "--no-compile", f"torch=={torch}", python=python, attempts=2)
    pip("install", "--no-compile", f"flashinfer-python=={version}", f"{ROOT}[test]", python=python, attempts=2)
    return Site(version, None, python)


def run_leg(site: Site, inductor_cache: Path) -> dict:
    return {**run_tests(site, inductor_cache), "release_parts": release_parts(site)}


def run_tests(site: Site, inductor_cache: Path) -> dict:
    probe = site.probe()
    torch, stand_in = probe["torch"], None
    if probe["import_error"] is not None:
        shim = site.run("import fp4_dynamo_shim; print(fp4_dynamo_shim.status()['problem'])")  # as a user sees it
        stand_in = {"import_error": probe["import_error"],
                    "shim_problem": shim.stdout.strip().splitlines()[-1] if shim.stdout else None}
        site = dataclasses.replace(site, stand_in=True)
        if site.import_error() is not None:
            return {**stand_in, "seconds": 0.0, "failures": [], "torch": torch}
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "junit.xml"
        started = time.perf_counter()
        # Kernels compiled by inductor are shared between legs (keyed by their source), whole graphs are not:
        # torch's graph cache key leaves out a custom op's schema, so a graph of torch.ops.flashinfer.fp4_quantize
        # compiled under 0.7.4 (8 parameters) was loaded under 0.6.12 (7) and called the op with 8 arguments.
        completed = subprocess.run(
            [site.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not release_independent",
             f"--junitxml={report}", *check_files()],
            cwd=ROOT, capture_output=True, text=True,
            env=site.environment(TORCHINDUCTOR_CACHE_DIR=str(inductor_cache), TORCHINDUCTOR_FX_GRAPH_CACHE="0",
                                 TORCHINDUCTOR_AUTOGRAD_CACHE="0"),
        )
        seconds = time.perf_counter() - started
        if not report.exists():
            return {"error": (completed.stdout + completed.stderr)[-2000:], "seconds": seconds}
        leg = read_leg([report])
    return {**leg, "seconds": seconds, "stand_in": stand_in, "torch": torch,
            "tail": completed.stdout[-3000:] if leg["failures"] else ""}


def installed_leg(reports: list) -> tuple:
    """(release, leg) of this environment's own FlashInfer and torch, from the JUnit reports of the whole suite
    run here (CI's README command and slow tier): they ran every file of CHECKS on exactly this leg."""
    import importlib.metadata
    import torch

    leg, release = read_leg(reports), importlib.metadata.version("flashinfer-python")
    return release, {**leg, "seconds": 0.0, "stand_in": None, "torch": torch.__version__, "tail": "",
                     "release_parts": release_parts(Site(release))}


def probe_refusal(site: Site) -> dict:
    completed = site.run(REFUSAL_PROBE)
    if completed.returncode != 0:
        return {"ok": False, "detail": completed.stderr[-1500:]}
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    result["refused_cleanly"] = (not result["applied"] and result["untouched"] and len(result["warnings"]) == 1
                                 and "not supported" in (result["problem"] or ""))
    strict = site.run("import fp4_dynamo_shim", FP4_DYNAMO_SHIM_STRICT="1")
    result["strict_raises"] = strict.returncode != 0 and "ApplyError" in strict.stderr
    result["ok"] = result["refused_cleanly"] and result["strict_raises"]
    return result


def tested_record_leg(legs: dict) -> Optional[str]:
    """Why the newest tested release's leg disagrees with the committed record of its sources, or None."""
    sys.path.insert(0, str(ROOT / "src"))
    from _fp4_dynamo_shim.versions import LAST_FLASHINFER

    judged = legs.get(LAST_FLASHINFER, {}).get("release_parts")
    if judged is None:
        return None
    differing = [name for name, part in judged.get("parts", {}).items() if not part["matches"]]
    if "error" in judged or differing:
        return (f"flashinfer {LAST_FLASHINFER} differs from its own record ({', '.join(differing) or judged.get('error')}): "
                "run python tools/release_parts.py --record with it installed")
    return None


def leg_name(version: str, torch: Optional[str] = None) -> str:
    return version if torch is None else f"{version}, torch {torch}"


class Legs:
    """The legs still to run, taken by ``--jobs`` runner threads. A leg whose environment is still being built
    is awaited; once built it goes first, so that its long test run overlaps the others."""

    def __init__(self, legs):
        self.legs, self.building, self.ready = list(legs), 0, threading.Condition()

    def build(self, make_leg) -> None:
        with self.ready:
            self.building += 1

        def built() -> None:
            try:
                leg = make_leg()
            except BaseException as error:  # the runner that takes this leg raises it

                def leg(error=error):
                    raise error
            with self.ready:
                self.building -= 1
                self.legs.insert(0, leg)
                self.ready.notify_all()

        threading.Thread(target=built, daemon=True).start()

    def take(self):
        with self.ready:
            while not self.legs and self.building:
                self.ready.wait()
            return self.legs.pop(0) if self.legs else None


def run_all(options, scratch: Path) -> tuple:
    """(legs, refusals): every leg, ``--jobs`` at a time; an other-torch leg's environment is built beside the
    first legs (it is mostly download and unpacking) and its leg runs next once it is ready."""
    wheels, started = scratch / "wheels", time.perf_counter()
    if options.newest:
        newest = newest_release(wheels)
        options.versions = [*options.versions, *([newest] if newest not in options.versions else [])]
        print(f"newest flashinfer-python on the registry: {newest}", flush=True)
    download([*options.versions, *UNSUPPORTED, *(v for v, _ in options.other_torch)], wheels)
    print(f"downloaded the wheels in {time.perf_counter() - started:.0f} s", flush=True)
    inductor_cache = scratch / "inductor"
    legs, refusals, lock, errors = {}, {}, threading.Lock(), []

    def report(name: str, leg: dict) -> None:
        bad = "error" in leg or leg["failures"]  # a release that needs a GPU to import is not a failure here
        with lock:
            legs[name] = leg
            print(f"flashinfer {name}: {'FAILED' if bad else 'ok'} in {leg['seconds']:.0f} s", flush=True)
            if bad:
                print(leg.get("error") or "\n".join(leg["failures"]) + "\n" + leg["tail"], flush=True)

    def cpu_leg(version: str):
        return lambda: report(version, run_leg(install(version, wheels, scratch), inductor_cache))

    def other_torch_leg(version: str, torch: str):
        begun = time.perf_counter()
        site = torch_environment(version, torch, scratch)
        print(f"torch {torch} environment built in {time.perf_counter() - begun:.0f} s", flush=True)
        return lambda: report(leg_name(version, torch), run_leg(site, inductor_cache))

    own = installed_leg(options.installed_leg_from) if options.installed_leg_from else None
    if own is not None and own[0] in options.versions:
        report(own[0], own[1])
        print(f"flashinfer {own[0]}: read from {', '.join(map(str, options.installed_leg_from))} (this "
              "environment's release and torch)", flush=True)
    elif own is not None:
        print(f"--installed-leg-from: this environment's flashinfer {own[0]} is not among --versions; the reports "
              "are not used", flush=True)

    def refusal(version: str):  # first in the queue: seconds, which would otherwise run alone after every leg
        def probe() -> None:
            result = refusals[version] = probe_refusal(install(version, wheels, scratch))
            print(f"flashinfer {version} (unsupported): {'refused cleanly' if result['ok'] else result}", flush=True)
        return probe

    queue = Legs([*map(refusal, UNSUPPORTED), *(cpu_leg(v) for v in options.versions if v not in legs)])
    for version, torch in options.other_torch:
        queue.build(lambda version=version, torch=torch: other_torch_leg(version, torch))

    def runner() -> None:
        while (leg := queue.take()) is not None:
            try:
                leg()
            except BaseException as error:  # reported after the others finish
                errors.append(error)

    threads = [threading.Thread(target=runner) for _ in range(max(1, options.jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    order = [*options.versions, *(leg_name(v, t) for v, t in options.other_torch)]
    missing = [name for name in order if name not in legs]
    if missing:
        raise SystemExit(f"legs that did not run: {', '.join(missing)}")
    return {name: legs[name] for name in order}, refusals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "compatibility.md")
    parser.add_argument("--check", action="store_true", help="fail if the committed --output differs")
    parser.add_argument("--versions", nargs="+", default=VERSIONS)
    parser.add_argument("--other-torch", nargs="*", default=OTHER_TORCH, type=lambda s: tuple(s.split(":")),
                        metavar="FLASHINFER:TORCH", help="legs in their own venv with that torch (default: "
                        + ", ".join(f"{v}:{t}" for v, t in OTHER_TORCH) + "; none: --other-torch)")
    parser.add_argument("--jobs", type=int, default=2, help="legs run at once (default 2)")
    parser.add_argument("--installed-leg-from", type=Path, nargs="+", metavar="JUNIT",
                        help="read the leg of this environment's own release from these reports of the whole suite "
                        "run here (CI: the README command's and the slow tier's) instead of running it")
    parser.add_argument("--no-newest", dest="newest", action="store_false",
                        help="do not add the registry's highest release to --versions")
    options = parser.parse_args()
    cores.share_among(options.jobs)  # legs of 150 s took 80 s with one thread each on 2 cores
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fp4-matrix-") as scratch:
        legs, refusals = run_all(options, Path(scratch))
    failed = any("error" in leg or leg["failures"] for leg in legs.values())
    failed |= not all(result["ok"] for result in refusals.values())
    from_record = tested_record_leg(legs)
    if from_record is not None:
        print(from_record, flush=True)
        failed = True
    text = render(legs, refusals)
    print(f"matrix: {len(legs)} legs in {time.perf_counter() - started:.0f} s", flush=True)
    if options.check:
        committed = options.output.read_text() if options.output.exists() else ""
        if committed != text:
            print(f"{options.output} is stale; regenerate it with: python tools/matrix/run_matrix.py", flush=True)
            print(text)
            failed = True
    else:
        options.output.write_text(text)
        print(f"wrote {options.output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

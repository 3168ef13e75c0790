#!/usr/bin/env python3
"""The lock of every dependency's version (requirements.lock), and the check that newer releases cannot
surprise us.

    python3 .ci/deps.py lock [--upgrade-package NAME ...]
        Write requirements.lock from pyproject.toml's ranges (every extra, every platform and Python), keeping
        the versions it already pins except those named: updating a pin is a deliberate step.
    python3 .ci/deps.py newest [--work DIR] [-- PYTEST ARGS]
        Resolve the newest versions the ranges allow, print which packages moved against the lock, then run
        the suite in a virtual environment of each (the lock's and the newest) and print the tests whose
        outcome changed. Exit 1 where one did, 0 where none did (or nothing moved).

torch stays at the lock's version in both: the CPU build on this machine's disk (README's install names it).
Needs uv (the test environment's, or one on PATH); the suite runs twice, about half an hour on 2 cores.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
COMPILE = ["pip", "compile", "pyproject.toml", "--all-extras", "--universal", "--quiet"]
PYTEST = ["-n", "auto", "--maxprocesses", "4", "--dist", "loadfile", "-q", "-p", "no:cacheprovider"]
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)\s*(?:;\s*(.*))?$")


def uv() -> str:
    """The uv next to this Python (a virtual environment's), else the one on PATH."""
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.exists() else shutil.which("uv")
    if not found:
        sys.exit("error: uv not found (pip install uv, or run from the test environment)")
    return found


def pins(lock: Path) -> dict[tuple[str, str], str]:
    """(name, environment marker) → version, of a lock written by uv."""
    out = {}
    for line in lock.read_text().splitlines():
        m = PIN.match(line.strip())
        if m:
            out[(m[1].lower().replace("_", "-"), m[3] or "")] = m[2]
    return out


def torch_pin() -> str:
    versions = {v for (name, _), v in pins(LOCK).items() if name == "torch"}
    if len(versions) != 1:
        sys.exit(f"error: {LOCK.name}: expected one torch version, found {sorted(versions) or 'none'}")
    return versions.pop()


def compile_lock(out: Path, extra: list[str]) -> None:
    """uv pip compile into ``out``, torch held at the lock's version (its annotation names the pin, not the
    passing file that holds it)."""
    torch = f"torch=={torch_pin()}"
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as held:
        held.write(torch + "\n")
        held.flush()
        cmd = [uv(), *COMPILE, "-c", held.name, "-o", str(out), *extra]
        cmd += ["--custom-compile-command", "python3 .ci/deps.py lock"]
        subprocess.run(cmd, cwd=ROOT, check=True)
        out.write_text(out.read_text().replace(f"-c {held.name}", f"{torch} (held: the CPU build on disk)"))


def moved(old: Path, new: Path) -> list[tuple[str, str, str]]:
    """The packages whose version differs: (name [marker], locked, newest)."""
    a, b = pins(old), pins(new)
    rows = []
    for key in sorted(a.keys() | b.keys()):
        if a.get(key) != b.get(key):
            label = key[0] + (f" ; {key[1]}" if key[1] else "")
            rows.append((label, a.get(key, "-"), b.get(key, "-")))
    return rows


def venv(where: Path, lock: Path) -> Path:
    """A fresh virtual environment of the checkout's test extra, installed under ``lock``."""
    shutil.rmtree(where, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = where / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", f"torch=={torch_pin()}"], check=True)
    install = [uv(), "pip", "install", "-q", "--python", str(python), "-c", str(lock), "-e", ".[test]"]
    subprocess.run(install, cwd=ROOT, check=True)
    return python


def outcomes(junit: Path) -> dict[str, str]:
    """Test id → passed, failed, error or skipped, from pytest's JUnit XML."""
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        result[f"{case.get('classname')}::{case.get('name')}"] = kinds[0] if kinds else "passed"
    return result


def suite(python: Path, junit: Path, args: list[str]) -> dict[str, str]:
    subprocess.run([python, "-m", "pytest", *PYTEST, f"--junitxml={junit}", *args], cwd=ROOT)
    return outcomes(junit)


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def newest(work: Path, args: list[str]) -> int:
    work.mkdir(parents=True, exist_ok=True)
    lock = work / "newest.lock"
    shutil.copy(LOCK, lock)
    compile_lock(lock, ["--upgrade"])
    rows = moved(LOCK, lock)
    if not rows:
        print("Nothing moved: the lock holds the newest versions the ranges allow.")
        return 0
    print(f"{len(rows)} packages move from {LOCK.name} to the newest the ranges allow:\n")
    table(("package", "locked", "newest"), rows)
    before = suite(venv(work / "locked", LOCK), work / "locked.xml", args)
    after = suite(venv(work / "newest", lock), work / "newest.xml", args)
    changed = [
        (test, before.get(test, "-"), after.get(test, "-"))
        for test in sorted(before.keys() | after.keys())
        if before.get(test) != after.get(test)
    ]
    print(f"\n{len(changed)} of {len(after)} tests changed outcome with the newest versions.\n")
    if changed:
        table(("test", "locked", "newest"), changed)
        print(f"\nJUnit reports: {work / 'locked.xml'}, {work / 'newest.xml'}")
    return 1 if changed else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    lock = verbs.add_parser("lock", help="write requirements.lock, keeping its pins but those named")
    lock.add_argument("--upgrade-package", "-P", action="append", default=[], metavar="NAME")
    check = verbs.add_parser("newest", help="the suite with the newest versions the ranges allow")
    check.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "memdpc-newest")
    check.add_argument("pytest_args", nargs="*", help="after --: what the suite runs (default: all of it)")
    args = parser.parse_args()
    if args.verb == "lock":
        compile_lock(LOCK, [f"--upgrade-package={name}" for name in args.upgrade_package])
        return 0
    return newest(args.work, args.pytest_args)


if __name__ == "__main__":
    sys.exit(main())

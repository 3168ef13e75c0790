"""requirements.lock: it pins every dependency pyproject.toml names within its range, the environment the tests
run in is the lock's, and README's install lines and .ci/run install under it with the same torch."""

from __future__ import annotations

import re
import sysconfig
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)\s*(?:;\s*(.*))?$")


def lock() -> dict[str, str]:
    """Package → version the lock pins for this Python and platform (its environment markers evaluated)."""
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        m = PIN.match(line.strip())
        if m and (not m[3] or Marker(m[3]).evaluate()):
            assert canonicalize_name(m[1]) not in pins, f"two pins of {m[1]} apply here"
            pins[canonicalize_name(m[1])] = m[2]
    return pins


def declared() -> list[Requirement]:
    """What the installed package asks for, with every extra, on this Python and platform."""
    extras = metadata.metadata("memdpc").get_all("Provides-Extra") or []
    reqs = [Requirement(r) for r in metadata.requires("memdpc") or []]
    return [r for r in reqs if not r.marker or any(r.marker.evaluate({"extra": e}) for e in [*extras, ""])]


def test_every_declared_dependency_is_pinned_within_its_range():
    pins = lock()
    for req in declared():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in requirements.lock: python3 .ci/deps.py lock"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} outside {req}"


def test_the_environment_is_the_locks():
    """What this suite runs with is what the lock pins (torch's local build label aside: the CPU build). Read
    from the environment's site-packages, not sys.path: once setuptools is imported, its folder of vendored
    packages (platformdirs, zipp, wheel and others, each at setuptools' own version) is on sys.path."""
    pins, off = lock(), []
    site = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    for dist in metadata.distributions(path=site):
        name = canonicalize_name(dist.metadata["Name"])
        if name in pins and dist.version.split("+")[0] != pins[name]:
            off.append(f"{name} {dist.version} (lock: {pins[name]})")
    assert off == [], "installed without -c requirements.lock?"


def test_readmes_install_lines_and_ci_install_the_locks_torch_under_the_lock():
    torch = f"torch=={lock()['torch']}"
    readme = (ROOT / "README.md").read_text()
    lines = [
        re.search(rf"<!-- ci:{name} -->\n```bash\n(.*?)\n```", readme, re.S)[1] for name in ("main", "test")
    ]
    for line in lines:
        assert f'pip install "{torch}" -e ' in line and "-c requirements.lock" in line, line
    ci = (ROOT / ".ci" / "run").read_text()
    assert f'"{torch}"' in ci and "-c requirements.lock" in ci
    assert re.search(r"key=\$\(cat [^)]*requirements\.lock", ci), "the CI cache is keyed by the lock"

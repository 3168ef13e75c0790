import subprocess
import sys
from pathlib import Path

from memdpc import __version__

# the console script installed beside the running interpreter (works with or without an activated venv)
MEMDPC = str(Path(sys.executable).parent / "memdpc")


def test_console_script_lists_verbs_and_version():
    out = subprocess.run([MEMDPC, "--help"], capture_output=True, text=True, check=True).stdout
    for verb in ("index", "data"):
        assert f"  {verb} " in out
    version = subprocess.run([MEMDPC, "--version"], capture_output=True, text=True, check=True).stdout
    assert __version__ in version


def test_unknown_path_is_one_line_error(tmp_path):
    res = subprocess.run(
        [MEMDPC, "index", str(tmp_path / "nope"), "--layout", "ucf101"], capture_output=True, text=True
    )
    assert res.returncode == 2
    assert "dataset root is not a folder" in res.stderr
    assert "Traceback" not in res.stderr

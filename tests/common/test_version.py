"""common/version.py: the one place the version is written; the installed package's metadata (which pyproject.toml
reads from it), the command line and ``memdpc.__version__`` all give it."""

from importlib import metadata

from click.testing import CliRunner

import memdpc
from memdpc.cli import main
from memdpc.common.version import __version__


def test_the_version_is_written_once_and_read_everywhere():
    assert metadata.version("memdpc") == __version__ == memdpc.__version__
    assert CliRunner().invoke(main, ["--version"]).output.strip() == f"memdpc, version {__version__}"

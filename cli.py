"""The ``memdpc`` command line: the group, its exit codes and the list of verbs (one module each in
:mod:`memdpc.commands`, which parse options and call one library function).

Exit codes: 0 done; 1 done with failures a verb reports (``--strict``, ``shard --verify``); 2 a user error
(:class:`memdpc.common.errors.UserError` and click's usage errors), one line; 74 (:data:`EXIT_RESOURCE`,
sysexits' EX_IOERR) the run stopped on a fault of its resources (:class:`memdpc.common.errors.ResourceFault`: the
output's disk full, a quota, the output read-only or forbidden, a worker killed), one line saying what failed,
the space free there and what was kept, and that the same command resumes; 128 + the signal when stopped by
SIGINT (130) or SIGTERM (143), after saying what was kept.
"""

from __future__ import annotations

import importlib

import click
from rich.markup import escape

from memdpc.common import interrupts
from memdpc.common.console import rich_console
from memdpc.common.errors import ResourceFault, UserError
from memdpc.common.version import __version__

__all__ = ["EXIT_RESOURCE", "main"]

EXIT_RESOURCE = 74  # sysexits.h EX_IOERR: the run stopped on a fault of its resources, resumable


# the verbs in the order of the data (example data, index, preprocess, shard, train, eval), then the helpers; each is
# the module of memdpc.commands of that name, whose ``command`` is the verb. ``--help`` lists them by name, as click does
VERBS = (
    "data",
    "index",
    "preprocess",
    "shard",
    "train",
    "eval",
    "convert",
    "recipes",
    "quickstart",
    "show",
    "report",
    "bench",
)


class _Group(click.Group):
    """The verbs, each imported when it is named (one verb's start does not import every other verb's options and
    their modules; ``memdpc --help`` imports them all). Turns a UserError from any verb into a one-line usage error
    (exit 2), a resource fault into one line of what failed and what the verb kept (exit :data:`EXIT_RESOURCE`),
    and an interrupt into what the verb kept and exit code 128 + the signal."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(VERBS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in VERBS:
            return None
        return importlib.import_module(f"memdpc.commands.{cmd_name}").command

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as e:
            raise click.UsageError(str(e)) from None
        except ResourceFault as e:
            rich_console(stderr=True).print(f"[red]stopped:[/red] {escape(e.line())}", soft_wrap=True)
            ctx.exit(EXIT_RESOURCE)
        except KeyboardInterrupt as e:
            stop = interrupts.as_interrupted(e)
            rich_console(stderr=True).print(
                f"[yellow]interrupted ({stop}):[/yellow] " + escape("; ".join(stop.notes) or "nothing kept"),
                soft_wrap=True,
            )
            ctx.exit(stop.exit_code)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="memdpc")
def main() -> None:
    """memdpc: self-supervised video representation learning with Memory-augmented Dense Predictive Coding."""
    interrupts.install()


if __name__ == "__main__":
    main()

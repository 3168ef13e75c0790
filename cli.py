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

import click
from rich.markup import escape

from memdpc.commands import (
    bench,
    convert,
    data,
    index,
    preprocess,
    quickstart,
    recipes,
    report,
    shard,
    show,
    train,
)
from memdpc.commands import eval as evaluate
from memdpc.common import interrupts
from memdpc.common.console import rich_console
from memdpc.common.errors import ResourceFault, UserError
from memdpc.common.version import __version__

__all__ = ["EXIT_RESOURCE", "main"]

EXIT_RESOURCE = 74  # sysexits.h EX_IOERR: the run stopped on a fault of its resources, resumable


class _Group(click.Group):
    """Turns a UserError from any verb into a one-line usage error (exit 2), a resource fault into one line of
    what failed and what the verb kept (exit :data:`EXIT_RESOURCE`), and an interrupt into what the verb kept and
    exit code 128 + the signal."""

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


# the verbs in the order of the data: example data, index, preprocess, shard, train, eval; then the helpers. Each
# module of memdpc.commands is one verb: its ``command``, which carries the verb's name
VERBS = (data, index, preprocess, shard, train, evaluate, convert, recipes, quickstart, show, report, bench)
for verb in VERBS:
    main.add_command(verb.command)

if __name__ == "__main__":
    main()

"""One module per subcommand; each defines ``command`` (a click command)."""

import click


class ArgsKept(click.Command):
    """Keeps the arguments as typed (``ctx.meta["args"]``): a stopped run prints the command that goes on."""

    def parse_args(self, ctx, args):
        ctx.meta["args"] = list(args)
        return super().parse_args(ctx, args)


def own_long_options(ctx) -> tuple[str, ...]:
    """The running command's own long options (``--shorter-side``): given after ``--`` they would reach Beam, which
    drops what it does not know (``runner.check_beam_args`` refuses them by name)."""
    return tuple(option for param in ctx.command.params for option in (*param.opts, *param.secondary_opts)
                 if option.startswith("--"))

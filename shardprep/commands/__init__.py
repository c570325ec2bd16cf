"""One module per subcommand; each defines ``command`` (a click command)."""

import click


class ArgsKept(click.Command):
    """Keeps the arguments as typed (``ctx.meta["args"]``): a stopped run prints the command that goes on."""

    def parse_args(self, ctx, args):
        ctx.meta["args"] = list(args)
        return super().parse_args(ctx, args)


def check_beam_args(ctx, beam_args, usage: str) -> None:
    """Beam's options after ``--`` checked (``runner.check_beam_args``), the command's own long options among them
    refused by name: Beam would drop what it does not know."""
    from shardprep.pipelines.runtime import runner

    own = tuple(option for param in ctx.command.params for option in (*param.opts, *param.secondary_opts)
                if option.startswith("--"))
    try:
        runner.check_beam_args(list(beam_args), usage, own)
    except runner.BeamArgsError as e:
        raise click.ClickException(str(e)) from None

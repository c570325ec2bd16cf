"""``shardprep``: one click group; each subcommand is ``command`` in ``shardprep/commands/<name>.py``, imported
lazily (``--help`` pays for no TensorFlow or Beam import). TensorFlow's C++ log lines are hidden unless ``--verbose``.
"""

import sys

try:  # the console script imports this module before any Ctrl-C handling runs: a Ctrl-C now is the CLI's too
    import importlib

    import click

    from shardprep import output
    from shardprep.pipelines.runtime import stopping
    from shardprep.preprocess.checks import streams
except KeyboardInterrupt:
    sys.stderr.write("stopped (Ctrl-C)\n")
    raise SystemExit(130) from None

SUBCOMMANDS = {
    "preprocess": "Decode, resize and re-shard images into uniform TFRecords (an Apache Beam job).",
    "train": "Train ResNet-18 from prepared shards and report how input-bound each epoch was.",
    "validate": "Check a prepared dataset (or tfrecord:GLOB input) and report its statistics.",
    "predict": "Classify photos with a trained model.keras, naming the dataset's classes.",
    "demo-data": "Write the built-in demo dataset (a small generated ImageFolder tree) to a folder.",
}


class LazyGroup(click.Group):
    def main(self, args=None, **kwargs):
        """Output click cannot write ends the process with one line and its status, never a traceback
        (``shardprep.output``). A stdin or stderr closed at the start (``2>&-``) is ``/dev/null``."""
        streams.open_closed_streams()
        args = sys.argv[1:] if args is None else list(args)
        with output.failed_writes_exit(help_asked=bool({"-h", "--help"} & set(args))):
            return super().main(args, **kwargs)

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent, **extra)
        except (KeyboardInterrupt, click.ClickException) as error:
            raise _ended(error) from None

    def list_commands(self, ctx):
        return list(SUBCOMMANDS)

    def get_command(self, ctx, name):
        if name not in SUBCOMMANDS:
            return None
        return importlib.import_module(f"shardprep.commands.{name.replace('-', '_')}").command

    def invoke(self, ctx):
        try:
            with stopping.sigterm_stops():
                return super().invoke(ctx)
        except (KeyboardInterrupt, click.ClickException) as error:
            raise _ended(error) from None

    def resolve_command(self, ctx, args):
        """Also refuses, before the command is imported, a gs:// argument this install cannot read (no gcp extra)."""
        if args and args[0] in SUBCOMMANDS and not ctx.resilient_parsing and not {"-h", "--help"} & set(args[1:]):
            from shardprep.preprocess.checks import install_extras

            try:
                install_extras.check_arguments(args[1:])
            except install_extras.MissingExtraError as error:
                raise click.ClickException(str(error)) from None
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx, formatter):
        with formatter.section("Commands"):
            formatter.write_dl(list(SUBCOMMANDS.items()))


def _ended(error: BaseException) -> click.exceptions.Exit:
    """Ctrl-C ends any command (or click reading its arguments) with one line and status 130 (128 + SIGINT, as
    shells say), SIGTERM with 143, where click says "Aborted!" with 1 (a command may say more first: preprocess's
    what was kept). An error line that stderr cannot take keeps its status (a usage error's 2)."""
    if isinstance(error, click.ClickException):
        with output.reader_may_go(err=True):  # a stderr that cannot take the error line is silenced
            output.show_error(error)
        return click.exceptions.Exit(error.exit_code)
    output.say(f"stopped ({getattr(error, 'by', 'Ctrl-C')})", err=True)
    return click.exceptions.Exit(stopping.exit_status(error))


def _print_version(ctx, param, value) -> None:
    """``--version`` as click prints it, the version looked up only when asked (this module imports little)."""
    if not value or ctx.resilient_parsing:
        return
    from shardprep import __version__

    output.say(f"shardprep, version {__version__}")
    ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version and exit.")
@click.option("--verbose", is_flag=True,
              help="On failure, print the full traceback after the error line; show TensorFlow's and Beam's own logs.")
def main(verbose):
    """shardprep: get image data into a GPU training loop without starving it.

    preprocess decodes and resizes every image once, offline; train reads the result with almost no host work.
    """
    if verbose:
        streams.restore()  # an earlier command in this process (a notebook, a test) may have quieted it
    else:
        streams.quiet_tensorflow()
    streams.quiet_beam(verbose)  # by the loggers' names: Beam is not imported here


if __name__ == "__main__":
    main()

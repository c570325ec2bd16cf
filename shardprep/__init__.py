"""The ``shardprep`` command line."""


def __getattr__(name: str):
    """``__version__``, the installed distribution's version (setup.py), read from its metadata when asked: the
    manifest module it comes from imports NumPy, which the console script's first import should not wait for."""
    if name == "__version__":
        from shardprep.preprocess.format.manifest import tool_version

        return tool_version()
    raise AttributeError(f"module 'shardprep' has no attribute {name!r}")

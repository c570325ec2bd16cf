"""The ``shardprep`` command line."""

from shardprep.preprocess.manifest import tool_version

__version__ = tool_version()  # the installed distribution's version (setup.py), read from its metadata

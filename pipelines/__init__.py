"""Apache Beam pipelines (preprocess, validate): thin graphs of named stages over ``preprocess/``."""

if __name__ != "shardprep.pipelines":  # the folder imported by its bare name, e.g. from the repository's root
    raise ImportError(f"pipelines/ is installed as shardprep.pipelines: import shardprep.pipelines, not {__name__} "
                      "(a second copy of its modules, with classes of their own)")

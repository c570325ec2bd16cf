"""Apache Beam pipelines (preprocess, validate): thin graphs of named stages over ``preprocess/``."""

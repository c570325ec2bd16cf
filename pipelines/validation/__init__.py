"""What ``shardprep validate`` computes, as plain Python (no Beam): checks, statistics, the report, the pictures and
the near-duplicate search's parts; the Beam stages in ``pipelines/validate_*.py`` route data to these functions."""

"""What ``shardprep validate`` computes, as plain Python: no Beam graph, no pipeline API.

``elements`` (the typed values validate's stages pass), ``framing`` (reading TFRecord framing with recovery),
``checks`` (each check as a function returning problems), ``stats`` (mergeable statistics), ``report`` (the JSON
report from the pipeline's result lines) and ``pictures`` (the contact sheet and the class-count chart). The Beam
stages in ``pipelines/validate_read.py`` and ``pipelines/validate_stages.py`` route data to these functions.
"""

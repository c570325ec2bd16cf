"""Pure per-image and per-record operations: decode by content, colour conversion, resize, encode, record format.

Nothing here imports Apache Beam's pipeline API; the Beam graphs in ``pipelines/`` call these functions.
"""

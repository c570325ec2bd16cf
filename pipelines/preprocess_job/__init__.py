"""The preprocess job's Beam graph and its composite stages: listing, exclude, decode, boundaries, shards, the manifest writer. May import pipelines/runtime, pipelines/sources and preprocess/."""

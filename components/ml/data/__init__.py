"""Data: snapshots with stable splits and content-addressed shards, datasets, raw sources,
per-sample features, the server's prediction log and harvesting it back into a source."""

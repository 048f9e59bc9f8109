"""What comes in: text out of uploads (extraction in bounded worker processes), chunking, locations, ids, ingest jobs."""

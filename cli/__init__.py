"""`poolserve` commands that talk to a running stack over HTTP: ingest, query, collections, tenants.
Registered on cli/main.py's app; only httpx, typer and rich (no Ray, no stack code)."""

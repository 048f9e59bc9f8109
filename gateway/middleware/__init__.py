"""A request's way in, before any route runs: tenant auth and limits, the body, pool and proxy guards, read lanes, public paths."""

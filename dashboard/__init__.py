"""The operator's dashboard, pure parts: session tokens, the memory history ring, HTML rendering.
The routes that serve it are gateway/routes/dashboard_api.py; static/ holds its script, style and the vendored
uPlot (static/VENDORED.md). No Ray imports here."""

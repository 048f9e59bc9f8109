"""The Ray Serve deployments (the user's card calls this folder `deployments/`): the app builder (app.py) and the
replicas it binds, each with its own typed section of the Plan: chat, embedder, retriever, gateway, and the start
order between them. "serve" stays Ray Serve's word: `ray.serve`, `serve.yaml`, `serve run`, `make serve`."""

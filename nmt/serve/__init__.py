"""nmt-serve: translation over HTTP for one or more checkpoints, with dynamic batching.

- config.py    ServeConfig: nmt-serve's options (listening, batching, request limits)
- models.py    the served models: names (NAME=CHECKPOINT or the file's stem), background loading
- batching.py  Batcher: one decoding thread per model, batches across concurrent requests
- requests.py  what POST /translate accepts, checked; encoding and length limits
- app.py       the Starlette application: /translate, /health, /ready, JSON errors
- server.py    socket, uvicorn, graceful stop

Needs the ``serve`` extra (``pip install 'nmt[serve]'``: starlette and uvicorn); config.py
and models.py import without it.
"""

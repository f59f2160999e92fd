"""The daemon's HTTP side: ``/healthz``, ``/metrics`` and the web view (pages, their read-only data, live events).

Modules: :mod:`.http` serves the app (:mod:`.routes`) with uvicorn; :mod:`.auth` the bearer token;
:mod:`.data` and :mod:`.sql` the data endpoints and their queries; :mod:`.live` commit notices as
server-sent events; :mod:`.pages` the HTML; ``static/`` the vendored chart library and script.
"""

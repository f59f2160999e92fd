"""The daemon's HTTP side: ``/healthz``, ``/metrics`` and the web view (pages, their read-only data, live events).

Modules: :mod:`.http` serves the app (:mod:`.routes`) with uvicorn; :mod:`.auth` the bearer token;
:mod:`.data` and :mod:`.sql` the data endpoints and their queries, :mod:`.cache` their answers shared
per commit tick; :mod:`.live` commit notices as server-sent events; :mod:`.budget` the web view's
share of the machine under heavy ingest; :mod:`.pages` the HTML; :mod:`.assets` serves ``static/``
(the vendored chart library and the script) from memory. At the edge: :mod:`.hosts` answers only the
daemon's own ``Host`` names, :mod:`.headers` puts the framing and content policy on every answer, and
:mod:`.connections` bounds the connections slow clients may hold.
"""

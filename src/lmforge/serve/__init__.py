"""``lmforge serve``'s HTTP shell: an OpenAI-compatible API and a chat page over ``workflows.serving``.

    guard.py     the ASGI layer every request passes first: drain (503), API key (401), body size (413),
                 requests in flight, one metrics count and one JSON log line per request
    schemas.py   the request bodies, checked field by field (a bad one is a 400 naming the field)
    app.py       the routes (chat, completions, embeddings, classify, attention, models, health, metrics, the
                 page) and the server's state: work off the event loop, 429 beyond --max-queue
    reply.py     one request's tokens as the OpenAI shapes: the whole reply or server-sent events; a client
                 that goes away cancels its request
    logprobs.py  log-probabilities in OpenAI's two shapes (chat's content list, completions' columns)
    tools.py     tools and tool_choice: checked, stated in the prompt (the template's way or lmforge's words),
                 the grammar of a call
    tool_calls.py  a reply read as text or calls: message.tool_calls, or the streamed tool-call deltas
    errors.py    OpenAI's error object for every answer that is not a success, and the status of each failure
    metrics.py   /metrics in Prometheus' text format
    process.py   the process: the decoding engine stepping on the main thread, uvicorn in a thread or in a
                 process of its own, the drain after SIGTERM / SIGINT
    split.py     the HTTP server in a process forked from the engine's, the two speaking over a pipe
    chat.html    the chat page at / (one self-contained file: no CDN)

It sits beside ``lmforge.cli`` and above the workflows: only the CLI imports it, and what the model does is
``workflows.serving``. Needs the ``serve`` extra (``pip install 'lmforge[serve]'``).
"""

"""``lmforge serve``'s HTTP shell: FastAPI routes in the OpenAI shapes (app.py), their request bodies
(schemas.py), the chat page (chat.html), and the process that runs them beside the engine (process.py). Needs the
``serve`` extra (``pip install 'lmforge[serve]'``).

It sits beside ``lmforge.cli`` and above the workflows: what the model does is ``workflows.serving``.
"""

"""Drop-ins for agent runtimes: one module per runtime, each importing its runtime only
inside itself (``import sessionlog`` never imports any of them).

- :mod:`sessionlog.integrations.openai_agents`: a ``Session`` for the OpenAI Agents SDK
  (``pip install 'sessionlog[agents]'``).
"""

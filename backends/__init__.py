"""Backends of the sessionlog event store (installed as ``sessionlog.backends``).

Each backend implements :class:`sessionlog.contract.EventStore`; pick one by URL with
:func:`sessionlog.open_store`.
"""

"""The DuckDB history: the one writer and its schema, read-only queries and their NATS responder."""

from .writer import Store

__all__ = ["Store"]

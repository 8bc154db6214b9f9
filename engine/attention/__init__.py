from engine.attention.backends import AttentionBackend, get_backend

__all__ = ["AttentionBackend", "get_backend"]

"""Inferix client SDK: `Client` (blocking) and `AsyncClient` (asyncio) for the Scheduler API."""

from inferix.client.aio import AsyncClient, AsyncInteraction
from inferix.client.recordings import RecordingError
from inferix.client.retry import ReconnectPolicy
from inferix.client.sync import Client, Interaction
from inferix.client.tls import TlsError
from inferix.client.types import (
    ActionKeyInfo,
    ActionSchemaInfo,
    BlockDone,
    CommandAccepted,
    Event,
    MouseAxisInfo,
    PromptChange,
    SessionError,
    SessionInfo,
    StateChanged,
)

__all__ = [
    "ActionKeyInfo",
    "ActionSchemaInfo",
    "AsyncClient",
    "AsyncInteraction",
    "BlockDone",
    "Client",
    "CommandAccepted",
    "Event",
    "Interaction",
    "MouseAxisInfo",
    "PromptChange",
    "ReconnectPolicy",
    "RecordingError",
    "SessionError",
    "SessionInfo",
    "StateChanged",
    "TlsError",
]

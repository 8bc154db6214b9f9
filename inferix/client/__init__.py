"""Inferix client SDK: `Client` (blocking) and `AsyncClient` (asyncio) for the Scheduler API."""

from inferix.client.aio import AsyncClient, AsyncInteraction
from inferix.client.reconnect import ReconnectPolicy
from inferix.client.sync import Client, Interaction
from inferix.client.types import (
    BlockDone,
    CommandAccepted,
    Event,
    PromptChange,
    SessionError,
    SessionInfo,
    StateChanged,
)

__all__ = [
    "AsyncClient",
    "AsyncInteraction",
    "BlockDone",
    "Client",
    "CommandAccepted",
    "Event",
    "Interaction",
    "PromptChange",
    "ReconnectPolicy",
    "SessionError",
    "SessionInfo",
    "StateChanged",
]

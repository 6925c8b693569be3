"""Ferry's Python client: produce, consume and administer over REST and WebSocket.

Importable without Django: it needs only httpx and websockets. See docs/client.md.
"""

from ferry_client.admin import UNSET, Admin, DeadLetterPage
from ferry_client.consumer import AsyncConsumer, Consumer
from ferry_client.errors import BrokerUnavailable, FerryError, Reject
from ferry_client.producer import Producer
from ferry_client.producer_async import AsyncProducer
from ferry_client.reader import ArrowPage, FetchPage, PartitionOffsets, Reader
from ferry_client.records import Delivery, Message, SendHooks, SendResult
from ferry_client.transactions import (
    AsyncTransaction,
    CheckBackServer,
    CheckRequest,
    LocalTransactions,
    ReadProcessWrite,
    Transaction,
    check_back_app,
)

__all__ = [
    "UNSET",
    "Admin",
    "ArrowPage",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncTransaction",
    "BrokerUnavailable",
    "CheckBackServer",
    "CheckRequest",
    "Consumer",
    "DeadLetterPage",
    "Delivery",
    "FerryError",
    "FetchPage",
    "LocalTransactions",
    "Message",
    "PartitionOffsets",
    "Producer",
    "ReadProcessWrite",
    "Reader",
    "Reject",
    "SendHooks",
    "SendResult",
    "Transaction",
    "check_back_app",
]

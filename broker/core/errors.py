"""The BrokerError tree: every error the core raises, each with a stable code (docs/api.md)."""

from typing import Any


class BrokerError(Exception):
    """The broker refused the request."""

    code = "broker_error"
    # The default message when the detail names the thing, e.g. "No topic named {name!r}."
    template = ""

    def __init__(self, message: str | None = None, **detail: Any) -> None:
        if message is None and self.template:
            try:
                message = self.template.format(**detail)
            except (KeyError, IndexError):
                message = None
        self.message = message or (self.__doc__ or self.code).strip()
        self.detail = detail
        super().__init__(self.message)


class InvalidRequest(BrokerError):
    """The request is not valid."""

    code = "invalid_request"


class MalformedJson(InvalidRequest):
    """The request body is not valid JSON."""

    code = "malformed_json"


class MemberIdTaken(BrokerError):
    """That member id is in use in the group for another topic: leave first, or pick another."""

    code = "member_id_taken"
    template = (
        "Member {member_id!r} of group {group!r} consumes another topic: "
        "leave first, or pick another id."
    )


class InvalidTopicName(InvalidRequest):
    """Topic names are 1 to 200 characters from A-Z, a-z, 0-9, '.', '_' and '-', not only dots."""

    code = "invalid_topic_name"


class InvalidPartitionCount(InvalidRequest):
    """A topic needs at least one partition, and partitions can grow but never shrink."""

    code = "invalid_partition_count"


class InvalidMessage(InvalidRequest):
    """A message in the request is not valid."""

    code = "invalid_message"


class InvalidFilter(InvalidRequest):
    """The subscription filter is not valid."""

    code = "invalid_filter"


class BatchTooLarge(InvalidRequest):
    """The batch has more messages than the broker accepts in one request."""

    code = "batch_too_large"


class MessageTooLarge(BrokerError):
    """A message is larger than the topic's max_message_bytes."""

    code = "message_too_large"


class TopicNotFound(BrokerError):
    """No topic has that name."""

    code = "topic_not_found"
    template = "No topic named {name!r}."


class TopicExists(BrokerError):
    """A topic with that name already exists."""

    code = "topic_exists"
    template = "A topic named {name!r} already exists."


class PartitionNotFound(BrokerError):
    """The topic has no partition with that number."""

    code = "partition_not_found"
    template = "Topic {topic!r} has no partition {partition}."


class GroupHasMembers(BrokerError):
    """The group has live members on the topic; stop them or pass force."""

    code = "group_has_members"


class MemberNotFound(BrokerError):
    """The member is not in the group: it left or expired. Join again."""

    code = "member_not_found"
    template = "Member {member_id!r} is not in group {group!r} (left or expired): join again."


class ScheduledNotFound(BrokerError):
    """No scheduled message has that id: it was released, cancelled, or never existed."""

    code = "scheduled_not_found"
    template = "No scheduled message {id} (released, cancelled, or never scheduled)."


class GroupNotFound(BrokerError):
    """No consumer group has that name."""

    code = "group_not_found"
    template = "No consumer group named {group!r}."


class StaleGeneration(BrokerError):
    """The group rebalanced since this member's generation, or the partition is not its own."""

    code = "stale_generation"


class DeadLetterNotFound(BrokerError):
    """The group's dead-letter queue has no letter with that id."""

    code = "dead_letter_not_found"
    template = "Group {group!r} has no dead letter {id}."


class RedriveJobNotFound(BrokerError):
    """No redrive job has that id (or it is not this key's to see)."""

    code = "redrive_job_not_found"
    template = "No redrive job {id}."


class TopicFull(BrokerError):
    """The partition is at the topic's capacity and its overflow policy is reject."""

    code = "topic_full"


class OffsetOutOfRange(BrokerError):
    """The offset is outside the partition's stored range."""

    code = "offset_out_of_range"


class Unauthenticated(BrokerError):
    """A valid API key is required: send Authorization: Bearer <key>."""

    code = "unauthenticated"


class PermissionDenied(BrokerError):
    """This API key may not do that."""

    code = "permission_denied"


class ApiKeyNotFound(BrokerError):
    """No API key has that name."""

    code = "api_key_not_found"
    template = "No API key named {name!r}."


class ApiKeyExists(BrokerError):
    """An API key with that name already exists."""

    code = "api_key_exists"
    template = "An API key named {name!r} already exists."


class MessageNotFound(BrokerError):
    """No stored message at that position: retention or a purge removed it, or it is not yet."""

    code = "message_not_found"
    template = "Topic {topic!r} has no stored message at partition {partition}, offset {offset}."


class Unavailable(BrokerError):
    """The broker cannot reach its database just now. Retry after retry_after."""

    code = "unavailable"


class InsufficientStorage(BrokerError):
    """The broker's disk is full; nothing was stored. Retry once an operator has made room."""

    code = "insufficient_storage"


class TransactionNotFound(BrokerError):
    """No transaction has that id (or it is not this key's to see)."""

    code = "transaction_not_found"
    template = "No transaction {id}."


class Fenced(BrokerError):
    """A newer transaction of the same producer id fenced this one; it was rolled back."""

    code = "fenced"
    template = (
        "A newer begin of producer {producer_id!r} (epoch {epoch}) fenced this transaction; "
        "it was rolled back."
    )


class TransactionNotOpen(BrokerError):
    """The transaction has ended: it can no longer take messages, be committed or rolled back."""

    code = "transaction_not_open"
    template = "The transaction is {state} ({reason}); it cannot be changed any more."


class TransactionAborted(BrokerError):
    """The commit could not take effect as a whole, so the transaction was rolled back."""

    code = "transaction_aborted"

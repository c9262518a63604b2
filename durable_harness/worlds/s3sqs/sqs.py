"""SQS as the S3+SQS World's wake-up channel: one message per turn, visibility as the lease.

Package-private. Messages carry ``{"turn_id", "session_id", "token"}``; the token says
which message is the turn's current one (the turn object names it), so duplicates are
recognised and deleted. Every call here is best effort where the turn object already
decided the outcome: a stale receipt handle (the message was received again since) is
reported as ``False``, never as an error, because the next receiver will act on the
message with the turn object's state.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

from durable_harness.core.errors import ConfigError, WorldError
from durable_harness.worlds.s3sqs.store import error_code, raise_mapped

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

#: SQS's limits: visibility timeout and per-message delay, in whole seconds.
MAX_VISIBILITY = 43_200
MAX_DELAY = 900
_MISSING_QUEUE = frozenset(
    {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "NonExistentQueue"}
)
_STALE_RECEIPT = frozenset(
    {"ReceiptHandleIsInvalid", "InvalidParameterValue", "MessageNotInflight"}
)


def visibility(seconds: float) -> int:
    """Whole seconds for SQS from a float wait: 0 under one second, else rounded up.

    Rounding a sub-second wait down makes the message visible early (its receiver sees
    the turn object say "not yet" and hides it again); rounding up would deliver a
    0.2 s lease's turn a second late. Waits of a second or more round up, so a message
    never shows up before its lease ends.
    """
    if seconds < 1.0:
        return 0
    return min(math.ceil(seconds), MAX_VISIBILITY)


@dataclass(frozen=True)
class Message:
    message_id: str
    receipt: str
    turn_id: str
    session_id: str
    token: str
    receives: int  # ApproximateReceiveCount
    sent_at: float  # SentTimestamp, Unix seconds


class SqsQueue:
    """The turn queue (and, if its redrive policy names one, its dead-letter queue)."""

    def __init__(self, client: SQSClient, queue_url: str) -> None:
        self.client = client
        self.url = queue_url
        self.dead_letter_url: str | None = None
        self.max_receive_count: int | None = None

    def check(self) -> dict[str, str]:
        """Read the queue's attributes (it exists, we may use it) and its redrive policy."""
        try:
            attributes = self.client.get_queue_attributes(
                QueueUrl=self.url, AttributeNames=["All"]
            ).get("Attributes", {})
        except ClientError as exc:
            code = error_code(exc)
            if code in _MISSING_QUEUE:
                raise ConfigError(
                    f"SQS queue {self.url} does not exist: create it (see docs/s3sqs.md) or "
                    "fix DURABLE_HARNESS_SQS_QUEUE_URL"
                ) from exc
            if code in ("AccessDenied", "AccessDeniedException"):
                raise ConfigError(
                    f"access to SQS queue {self.url} was denied ({code}): the worker needs "
                    "the SQS permissions listed in docs/s3sqs.md"
                ) from exc
            self._raise("GetQueueAttributes", exc)
        except BotoCoreError as exc:
            self._raise("GetQueueAttributes", exc)
        policy = attributes.get("RedrivePolicy")
        if policy:
            try:
                parsed = json.loads(policy)
                arn = str(parsed["deadLetterTargetArn"])
                self.max_receive_count = int(parsed["maxReceiveCount"])
                account, name = arn.split(":")[4], arn.split(":")[5]
                self.dead_letter_url = str(
                    self.client.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)[
                        "QueueUrl"
                    ]
                )
            except (ValueError, KeyError, IndexError) as exc:
                raise ConfigError(
                    f"SQS queue {self.url} has a redrive policy durable-harness cannot read: "
                    f"{policy}"
                ) from exc
            except (ClientError, BotoCoreError) as exc:
                self._raise("GetQueueUrl (dead-letter queue)", exc)
        return {str(name): value for name, value in attributes.items()}

    def send(self, turn_id: str, session_id: str, token: str, delay: float = 0.0) -> None:
        body = json.dumps({"turn_id": turn_id, "session_id": session_id, "token": token})
        # A delay past SQS's 15 minutes just wakes a receiver early; it hides the message
        # again until the turn object's visible_at.
        seconds = min(visibility(delay), MAX_DELAY)
        try:
            self.client.send_message(QueueUrl=self.url, MessageBody=body, DelaySeconds=seconds)
        except (ClientError, BotoCoreError) as exc:
            self._raise("SendMessage", exc)

    def receive(self, hide_seconds: float, dead_letters: bool = False) -> list[Message]:
        """At most one message (from the dead-letter queue with ``dead_letters``).

        One at a time on purpose: a message received and handed back counts as a receive,
        and the redrive policy counts receives; batching would age healthy turns.
        Unparseable messages are deleted here (they can never name a turn).
        """
        url = self.dead_letter_url if dead_letters else self.url
        if url is None:
            return []
        try:
            response = self.client.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=1 if not dead_letters else 10,
                VisibilityTimeout=max(1, visibility(hide_seconds)),
                WaitTimeSeconds=0,
                MessageSystemAttributeNames=["ApproximateReceiveCount", "SentTimestamp"],
            )
        except (ClientError, BotoCoreError) as exc:
            self._raise("ReceiveMessage", exc)
        messages: list[Message] = []
        for raw in response.get("Messages", []):
            receipt = str(raw["ReceiptHandle"])
            parsed = _parse(raw)
            if parsed is None:
                self.delete(receipt, url)
                continue
            messages.append(parsed)
        return messages

    def hide(self, receipt: str | None, seconds: float) -> bool:
        """Make the message (in)visible for ``seconds``; ``False`` if the receipt is stale."""
        if not receipt:
            return False
        try:
            self.client.change_message_visibility(
                QueueUrl=self.url, ReceiptHandle=receipt, VisibilityTimeout=visibility(seconds)
            )
            return True
        except ClientError as exc:
            if error_code(exc) in _STALE_RECEIPT:
                return False
            self._raise("ChangeMessageVisibility", exc)
        except BotoCoreError as exc:
            self._raise("ChangeMessageVisibility", exc)

    def delete(self, receipt: str | None, url: str | None = None) -> None:
        """Delete the message; a stale receipt is ignored (its next receiver deletes it)."""
        if not receipt:
            return
        try:
            self.client.delete_message(QueueUrl=url or self.url, ReceiptHandle=receipt)
        except ClientError as exc:
            if error_code(exc) not in _STALE_RECEIPT:
                self._raise("DeleteMessage", exc)
        except BotoCoreError as exc:
            self._raise("DeleteMessage", exc)

    def delete_dead_letter(self, receipt: str) -> None:
        self.delete(receipt, self.dead_letter_url)

    def _raise(self, what: str, exc: Exception) -> NoReturn:
        endpoint = str(self.client.meta.endpoint_url)
        if isinstance(exc, EndpointConnectionError):
            raise WorldError(
                f"cannot reach SQS at {endpoint} ({what}): {exc}; check AWS_ENDPOINT_URL"
            ) from exc
        if isinstance(exc, ClientError):
            code = error_code(exc)
            advice = ""
            if code in _MISSING_QUEUE:
                advice = "; create it (see docs/s3sqs.md) or fix DURABLE_HARNESS_SQS_QUEUE_URL"
            elif code in ("AccessDenied", "AccessDeniedException"):
                advice = "; the worker needs the SQS permissions listed in docs/s3sqs.md"
            raise WorldError(f"SQS {what} on {self.url} failed: {exc}{advice}") from exc
        raise_mapped(f"SQS {what}", exc, endpoint)


def _parse(raw: Any) -> Message | None:
    try:
        body = json.loads(raw["Body"])
        attributes = raw.get("Attributes", {})
        return Message(
            message_id=str(raw["MessageId"]),
            receipt=str(raw["ReceiptHandle"]),
            turn_id=str(body["turn_id"]),
            session_id=str(body["session_id"]),
            token=str(body["token"]),
            receives=int(attributes.get("ApproximateReceiveCount", 1)),
            sent_at=int(attributes.get("SentTimestamp", time.time() * 1000)) / 1000.0,
        )
    except (ValueError, KeyError, TypeError):
        return None

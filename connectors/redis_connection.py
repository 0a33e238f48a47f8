"""The connection class of every asyncio Redis client here: redis-py's, with commands
packed by hiredis (``redis_packing``) and a send that cannot drop a cancellation.

redis-py sends each command under ``asyncio.wait_for`` whenever a socket timeout is set
(always, here), and Python 3.11's ``wait_for`` drops a cancellation that lands as the
call it wraps finishes (fixed in 3.12). A send finishes at once, so that is where most
cancellations of a task busy with Redis landed: 95 of 100 cancels of a task looping on
GET were dropped, 35 to 48 of 100 of one looping on a pipeline. A worker's side loops
(policy polls, heartbeats) then ran on after the worker stopped, and the event loop's
shutdown, which cancels what is left once and waits, could wait for ever.
``asyncio.timeout`` bounds the send the same way and keeps the cancellation; it also
makes no task per command.

Its parser also skips redis-py 8.1's debug line for each pub/sub message under RESP3
(redis-py's default protocol since 8.0): ``logger.debug("Push response: " +
str(response))`` formats the whole message before ``debug`` can drop it, whatever the log
level (redis/redis-py#4230, fixed upstream after 8.1). A result announcement carries a
batch's result bodies, so that was 4-5% of a caller's CPU (docs/performance.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from batchfleet.connectors.redis_packing import packed_by_hiredis

_MADE: dict[type[Any], type[Any]] = {}


def fleet_connection(base: type[Any]) -> type[Any]:
    """``base`` (a redis-py asyncio connection class) packing with hiredis and sending
    under ``asyncio.timeout``; one subclass per base, made on first use."""
    made = _MADE.get(base)
    if made is None:
        made = _MADE[base] = _quiet_push(_cancel_safe(packed_by_hiredis(base)))
    return made


_QUIET: dict[type[Any], type[Any]] = {}


def quiet_parser(parser_class: type[Any]) -> type[Any]:
    """``parser_class`` (a redis-py asyncio parser) handing a pub/sub message on as it
    came, without formatting it for a debug line first; one subclass per class."""
    made = _QUIET.get(parser_class)
    if made is None:
        class QuietPush(parser_class):  # type: ignore[misc]
            async def handle_pubsub_push_response(self, response: Any) -> Any:
                return response

        QuietPush.__name__ = QuietPush.__qualname__ = f"Quiet{parser_class.__name__}"
        made = _QUIET[parser_class] = QuietPush
    return made


def _quiet_push(base: type[Any]) -> type[Any]:
    class QuietPushConnection(base):  # type: ignore[misc]
        def set_parser(self, parser_class: type[Any]) -> None:
            super().set_parser(quiet_parser(parser_class))

    QuietPushConnection.__name__ = QuietPushConnection.__qualname__ = base.__name__
    return QuietPushConnection


def _cancel_safe(base: type[Any]) -> type[Any]:
    class CancelSafeSend(base):  # type: ignore[misc]
        async def send_packed_command(self, command: bytes | str | Iterable[bytes],
                                      check_health: bool = True) -> None:
            """redis-py's ``send_packed_command``, with ``asyncio.timeout`` for its
            ``wait_for``; everything else (connect, health check, errors) as there."""
            timeout = self.socket_timeout
            if not timeout:  # redis-py writes without wait_for then
                await super().send_packed_command(command, check_health)
                return
            if not self.is_connected:
                await self.connect_check_health(check_health=False)
            if check_health:
                await self.check_health()
            if isinstance(command, str):
                command = command.encode()
            chunks = [command] if isinstance(command, bytes) else command
            try:
                async with asyncio.timeout(timeout):
                    self._writer.writelines(chunks)
                    await self._writer.drain()
            except TimeoutError:
                await self.disconnect(nowait=True)
                raise RedisTimeoutError("Timeout writing to socket") from None
            except OSError as exc:
                await self.disconnect(nowait=True)
                err_no, message = ("UNKNOWN", exc.args[0]) if len(exc.args) == 1 \
                    else (exc.args[0], exc.args[1])
                raise RedisConnectionError(
                    f"Error {err_no} while writing to socket. {message}.") from exc
            except BaseException:  # a cancelled send leaves a half-written command
                await self.disconnect(nowait=True)
                raise

    CancelSafeSend.__name__ = CancelSafeSend.__qualname__ = f"Fleet{base.__name__}"
    return CancelSafeSend

"""The SDK client's tunables, each declared once with its default and help.

``AsyncClient``/``Client`` take them as keywords (``Client(broker, results=None,
**options)``, unchanged); their defaults in the signature are read from here, and a test
holds the signature and these fields equal, so the README's client table
(``make readme-table``) documents exactly the keywords the client accepts. No command
generates flags from them yet: the request commands expose only ``--namespace`` (the shared
declaration) and the ``--callback-*`` options, so every field but ``namespace`` is
``no_env``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batchfleet.connectors.ssrf import CallbackPolicy
from batchfleet.connectors.values import DEFAULT_POOL_TIMEOUT_S, DEFAULT_TTL_S
from batchfleet.producers.admission import AdmissionLimits
from batchfleet.producers.waiting import LOSS_GRACE_S
from batchfleet.schemas.settings import DEFAULT_NAMESPACE, NAMESPACE, opt, with_opt


@dataclass(frozen=True, slots=True)
class ClientSettings:
    namespace: str = field(default=DEFAULT_NAMESPACE, metadata=with_opt(NAMESPACE))
    result_ttl_s: int = field(default=DEFAULT_TTL_S, metadata=opt(
        "How long a submitted request's results are kept.", no_env=True))
    kafka_partitions: int = field(default=4, metadata=opt(
        "Kafka broker: partitions of the topics the client creates.", no_env=True))
    poll_interval_s: float = field(default=1.0, metadata=opt(
        "How often a waiting call reads the result store when no announcement came.",
        no_env=True))
    check_model: bool = field(default=True, metadata=opt(
        "Refuse a submit to a model no worker serves or declared (read from the registry).",
        no_env=True))
    callback_policy: CallbackPolicy | None = field(default=None, metadata=opt(
        "Where callback URLs may point (the --callback-* options).", internal=True))
    redis_max_connections: int | None = field(default=None, metadata=opt(
        "Size of the result store's connection pool.", no_env=True, show="100"))
    redis_pool_timeout_s: float = field(default=DEFAULT_POOL_TIMEOUT_S, metadata=opt(
        "How long a call past the pool waits for a free connection.", no_env=True))
    admission: AdmissionLimits | None = field(default=None, metadata=opt(
        "Marks past which submits raise OverloadedError (producers/admission.py).",
        internal=True))
    model_list_ttl_s: float = field(default=5.0, metadata=opt(
        "How long a model's registry record is trusted before it is read again.",
        no_env=True))
    loss_grace_s: float = field(default=LOSS_GRACE_S, metadata=opt(
        "Default of wait()'s loss_grace_s: how long a result may be missing after its "
        "worker is gone before the request counts as lost.", no_env=True))


#: The defaults ``AsyncClient``'s keywords take.
CLIENT_DEFAULTS = ClientSettings()

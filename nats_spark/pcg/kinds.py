"""The kinds of group (static, elastic) and of consumer layout (a consumer per partition or per
member). Parsing a format's options names them, so this imports nothing of nats-py."""

from __future__ import annotations

from enum import StrEnum

from nats_spark.pcg.config import ElasticConfig, StaticConfig


class GroupKind(StrEnum):
    STATIC = "static"
    ELASTIC = "elastic"

    @property
    def bucket(self) -> str:
        return f"{self.value}-consumer-groups"

    @property
    def config_type(self) -> type[StaticConfig | ElasticConfig]:
        return StaticConfig if self is GroupKind.STATIC else ElasticConfig


class ConsumerLayout(StrEnum):
    MEMBER = "member"  # one consumer per member, one filter per owned partition (Go's)
    PARTITION = "partition"  # one single-filter consumer per partition

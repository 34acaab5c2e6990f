"""Tickertape configuration: the XML format (`config.loader`), the typed tree (`config.model`).

from config import load_config, default_config, ConfigError
"""

from .errors import ConfigError, Problem
from .loader import default_config, load_config, load_config_text, verify_config
from .model import (
    Action,
    ActionStep,
    ActionTrigger,
    Admin,
    Authentication,
    Config,
    ContentFilter,
    Entitlement,
    Limits,
    LogTarget,
    QueueSpec,
    Rights,
    Role,
    SowTopicSpec,
    TopicSpec,
    TransactionLog,
    Transport,
)
from .values import parse_count, parse_inet_addr, parse_interval, parse_size

__all__ = [
    "Action",
    "ActionStep",
    "ActionTrigger",
    "Admin",
    "Authentication",
    "Config",
    "ConfigError",
    "ContentFilter",
    "Entitlement",
    "Limits",
    "LogTarget",
    "Problem",
    "QueueSpec",
    "Rights",
    "Role",
    "SowTopicSpec",
    "TopicSpec",
    "TransactionLog",
    "Transport",
    "default_config",
    "load_config",
    "load_config_text",
    "parse_count",
    "parse_inet_addr",
    "parse_interval",
    "parse_size",
    "verify_config",
]

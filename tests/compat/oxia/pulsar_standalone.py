"""Pulsar 4.0.7 standalone on TableKeeper's Oxia front-end: moved to tests/support/pulsar_oxia.py
(the integration tier's cluster test uses it too); the names stay importable from here."""

from tests.support.caches import pulsar_classpath
from tests.support.pulsar_oxia import MAIN_CLASS, PulsarOnOxia

__all__ = ["MAIN_CLASS", "PulsarOnOxia", "pulsar_classpath"]

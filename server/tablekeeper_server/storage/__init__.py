"""Sorted key/value engines that hold a range's materialized state. No gRPC, no logs here."""

"""Pulsar plumbing shared by the `pulsar` log (`log/pulsar.py`) and checkpoint store
(`checkpoint/pulsar.py`), one concern per module:

* `client`: the binary-protocol client, created on first use and shared by a backend's threads;
* `admin`: the admin REST calls (over `urllib`, JSON in and out);
* `topics`: one namespace's topic names, its policies and the topics' creation and deletion;
* `send`: sending a group of messages and waiting for every acknowledgement, fencing errors;
* `positions`: message ids as (ledger, entry, batch index) and back.

These modules and the two backends are the only ones that import the `pulsar` client.
"""

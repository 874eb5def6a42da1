"""The Oxia client protocol front-end (`--oxia-port`): Oxia namespaces are tables, their shards
are the tables' ranges, and every Oxia write is one logged range command."""

"""ZooKeeper's access control: ACLs, the ids a connection is authenticated as, and the checks.

A connection starts as `ip:<its address>`; `addauth digest user:password` adds
`digest:user:base64(sha1(user:password))` (any user and password are accepted: the digest is
what ACLs name). An ACL entry grants its permission bits to `world:anyone`, to one digest id, or
to an `ip` address or network (`10.0.0.0/8`). `auth` in an ACL being set stands for every
authenticated id of the caller (digest; an ip id is not "authenticated"). As in ZooKeeper
(`ZooKeeperServer.checkACL`, `PrepRequestProcessor.fixupACL`, the digest and ip providers).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from functools import lru_cache

from tablekeeper_server.zookeeper import jute
from tablekeeper_server.zookeeper.jute import Acl
from tablekeeper_server.zookeeper.znode import OPEN_ACL

AuthId = tuple[str, str]
"""(scheme, id) of one identity a connection is authenticated as."""

DIGEST = "digest"
IP = "ip"
WORLD = "world"
ANYONE = "anyone"


class InvalidAclError(Exception):
    """ZooKeeper's INVALIDACL."""


def digest_id(user_password: str) -> str:
    """`DigestAuthenticationProvider.generateDigest`: `user:base64(sha1("user:password"))`."""
    user = user_password.split(":", 1)[0]
    digest = hashlib.sha1(user_password.encode("utf-8")).digest()
    return f"{user}:{base64.b64encode(digest).decode('ascii')}"


def _valid_ip(expression: str) -> bool:
    """`IPAuthenticationProvider.isValid`: an address, or an address and a prefix length."""
    address, _, bits = expression.partition("/")
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return False
    if not bits:
        return True
    return bits.isdigit() and 0 <= int(bits) <= parsed.max_prefixlen


def _ip_matches(client: str, expression: str) -> bool:
    address, _, bits = expression.partition("/")
    try:
        allowed = ipaddress.ip_address(address)
        actual = ipaddress.ip_address(client)
    except ValueError:
        return False
    if allowed.version != actual.version:
        return False
    prefix = int(bits) if bits.isdigit() else allowed.max_prefixlen
    network = ipaddress.ip_network(f"{allowed}/{prefix}", strict=False)
    return actual in network


def _valid(scheme: str, ident: str) -> bool:
    if scheme == DIGEST:
        parts = ident.split(":")
        while parts and not parts[-1]:  # Java's split drops trailing empty parts
            parts.pop()
        return len(parts) == 2
    if scheme == IP:
        return _valid_ip(ident)
    return False  # no other provider here (world is only "anyone", handled before)


def fixup(acls: list[Acl] | None, auth: list[AuthId]) -> bytes:
    """The ACL a create or setACL stores (jute-encoded): duplicates dropped, `auth` expanded to
    the caller's authenticated ids. Raises `InvalidAclError` as ZooKeeper does (an empty list,
    an unknown scheme or malformed id, `auth` without an authenticated id)."""
    if not acls:
        raise InvalidAclError
    unique: list[Acl] = []
    for acl in acls:
        if acl not in unique:
            unique.append(acl)
    if unique == [(31, WORLD, ANYONE)]:
        return OPEN_ACL
    out: list[Acl] = []
    for perms, scheme, ident in unique:
        if scheme == WORLD and ident == ANYONE:
            out.append((perms, scheme, ident))
        elif scheme == "auth":
            authenticated = [(perms, s, i) for s, i in auth if s == DIGEST]
            if not authenticated:
                raise InvalidAclError
            out.extend(authenticated)
        elif _valid(scheme, ident):
            out.append((perms, scheme, ident))
        else:
            raise InvalidAclError
    return jute.write_acls(out)


@lru_cache(maxsize=4096)
def _parsed(acl: bytes) -> tuple[Acl, ...]:
    return tuple(jute.read_acls(acl, 0)[0] or ())


def decode(acl: bytes) -> tuple[Acl, ...]:
    return _parsed(acl)


def allowed(acl: bytes, perm: int, auth: list[AuthId]) -> bool:
    """Whether ids `auth` hold permission `perm` on a node with `acl` (an empty ACL allows
    everything, as in ZooKeeper)."""
    if acl == OPEN_ACL:
        return True
    entries = _parsed(acl)
    if not entries:
        return True
    for scheme, _ in auth:
        if scheme == "super":
            return True
    for perms, scheme, ident in entries:
        if not perms & perm:
            continue
        if scheme == WORLD and ident == ANYONE:
            return True
        for auth_scheme, auth_id in auth:
            if auth_scheme != scheme:
                continue
            if scheme == DIGEST and auth_id == ident:
                return True
            if scheme == IP and _ip_matches(auth_id, ident):
                return True
    return False


def masked(acl: bytes) -> bytes:
    """The ACL as getACL shows it to a caller without ADMIN: digest ids as `user:x`."""
    entries = _parsed(acl)
    if not any(scheme == DIGEST for _, scheme, _ in entries):
        return acl
    return jute.write_acls(
        [
            (perms, scheme, ident.split(":", 1)[0] + ":x" if scheme == DIGEST else ident)
            for perms, scheme, ident in entries
        ]
    )


def encode_auth(auth: list[AuthId]) -> bytes:
    """How a command carries its caller's ids (a jute vector of scheme/id pairs)."""
    return jute.write_strings([part for pair in auth for part in pair])


def decode_auth(raw: bytes) -> list[AuthId]:
    parts = jute.read_strings(raw, 0)[0]
    return [(parts[i], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]

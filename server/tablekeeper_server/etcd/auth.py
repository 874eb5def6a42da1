"""etcd's Auth service: users with passwords, and `Authenticate` (user + password -> token).

A user's name is its TableKeeper role: `Authenticate` answers a JWT whose subject is the user,
signed with the server's `--auth-secret-key` and valid `TOKEN_TTL_S`; etcd's clients send it in
`token` metadata with every call, and fetch a new one when told `etcdserver: invalid auth token`
(an expired token). What the user may do is its role's permissions on namespace `etcd`
(`tablekeeper auth grant etcd NAME read write`), or everything if it is a superuser role.

Users live in the root range (`RootCatalog.user`), as salted scrypt hashes
(`security.passwords`). Only superusers manage them (the access RULES); with authentication off
there are no users (etcd's answer: authentication is not enabled). etcd's own roles and key-range
permissions are not built: those methods answer UNIMPLEMENTED saying what to use instead.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from tablekeeper_proto.etcd import rpc_pb2, rpc_pb2_grpc
from tablekeeper_server.catalog.root import RootCatalog
from tablekeeper_server.errors import TableKeeperError
from tablekeeper_server.etcd.errors import EtcdError, from_tablekeeper
from tablekeeper_server.etcd.keyspace import Keyspace
from tablekeeper_server.security.frontend import FrontEndSecurity
from tablekeeper_server.security.passwords import NO_PASSWORD, hash_password, verify_password
from tablekeeper_server.security.tokens import HMAC_ALGORITHMS, create_token

log = logging.getLogger(__name__)

Context = Any
M = TypeVar("M")
TOKEN_TTL_S = 300.0
"""How long a token from Authenticate is valid (etcd's default token TTL); clients fetch a new
one when it has expired."""
HASHING_MAX = 2
"""Password hashes computed at once (each takes ~16 MiB and tens of milliseconds)."""
_NO_ROLES = (
    "tablekeeper: etcd roles and key-range permissions are not supported; a user's role is its "
    "own name: grant it permissions on namespace etcd (tablekeeper auth grant etcd USER read "
    "write)"
)
_FLAGS = (
    "tablekeeper: authentication is set by the server's flags (--auth-secret-key, "
    "--auth-public-key, --tls-client-ca), not by the etcd API"
)


@functools.cache
def _dummy_hash() -> bytes:
    """Checked against when a user does not exist, so a refusal takes as long either way."""
    return hash_password("not the password of anyone")


def _user_name(name: str) -> str:
    if not name:
        raise EtcdError("user_empty")
    if len(name) > 255 or any(c in name for c in "\x00\n"):
        raise EtcdError(
            "bad_user",
            code=grpc.StatusCode.INVALID_ARGUMENT,
            message="tablekeeper: a user name is 1..255 characters without NUL or newline",
        )
    return name


def _password(password: str, hashed: str) -> str:
    if hashed and not password:
        raise EtcdError(
            "hashed_password",
            code=grpc.StatusCode.INVALID_ARGUMENT,
            message="tablekeeper: send the password itself, not a client-side hash "
            "(the server keeps salted scrypt hashes of its own)",
        )
    if not password:
        raise EtcdError(
            "empty_password",
            code=grpc.StatusCode.INVALID_ARGUMENT,
            message="tablekeeper: the password is empty (add the user with no password for "
            "certificate-only use)",
        )
    return password


class AuthServicer(rpc_pb2_grpc.AuthServicer):
    def __init__(
        self, keyspace: Keyspace, security: FrontEndSecurity, token_ttl_s: float = TOKEN_TTL_S
    ) -> None:
        self._keyspace = keyspace
        self._security = security
        self._token_ttl_s = token_ttl_s
        self._hashing = asyncio.Semaphore(HASHING_MAX)

    # ------------------------------------------------------------------ helpers

    async def _call(self, context: Context, handler: Callable[[], Awaitable[M]]) -> M:
        try:
            return await handler()
        except EtcdError as exc:
            await context.abort(exc.code, exc.message)
        except TableKeeperError as exc:
            error = from_tablekeeper(exc)
            await context.abort(error.code, error.message)
        raise AssertionError("unreachable")  # context.abort raises

    def _root(self) -> RootCatalog:
        if not self._security.auth_on:
            raise EtcdError("auth_not_enabled")
        return self._keyspace.registry.root

    async def _hash(self, password: str) -> bytes:
        async with self._hashing:
            return await asyncio.to_thread(hash_password, password)

    async def _verify(self, record: bytes, password: str) -> bool:
        async with self._hashing:
            return await asyncio.to_thread(verify_password, record, password)

    def _header(self) -> rpc_pb2.ResponseHeader:
        return Keyspace.header(0)

    def _signing_key(self) -> bytes:
        authenticator = self._security.authenticator
        verifier = authenticator.verifier if authenticator is not None else None
        if verifier is None or verifier.algorithms != HMAC_ALGORITHMS:
            raise EtcdError(
                "cannot_sign",
                code=grpc.StatusCode.FAILED_PRECONDITION,
                message="tablekeeper: this server cannot issue tokens (it needs "
                "--auth-secret-key to sign them); use a client certificate or a token",
            )
        return verifier.key

    # ------------------------------------------------------------------ tokens

    async def Authenticate(  # noqa: N802 (gRPC method names)
        self, request: rpc_pb2.AuthenticateRequest, context: Context
    ) -> rpc_pb2.AuthenticateResponse:
        async def handle() -> rpc_pb2.AuthenticateResponse:
            root = self._root()
            key = self._signing_key()
            record = root.user(request.name) if request.name else None
            matches = await self._verify(record or _dummy_hash(), request.password)
            if record is None or not matches:
                self._security.count_failure("bad_password")
                log.warning(
                    "etcd Authenticate refused for user %r from %s: unknown user or wrong password",
                    request.name,
                    context.peer(),
                )
                raise EtcdError("auth_failed")
            token = create_token(key, request.name, self._token_ttl_s)
            return rpc_pb2.AuthenticateResponse(header=self._header(), token=token)

        return await self._call(context, handle)

    async def AuthStatus(  # noqa: N802
        self, request: rpc_pb2.AuthStatusRequest, context: Context
    ) -> rpc_pb2.AuthStatusResponse:
        on = self._security.auth_on
        return rpc_pb2.AuthStatusResponse(header=self._header(), enabled=on, authRevision=int(on))

    async def AuthEnable(  # noqa: N802
        self, request: rpc_pb2.AuthEnableRequest, context: Context
    ) -> rpc_pb2.AuthEnableResponse:
        async def handle() -> rpc_pb2.AuthEnableResponse:
            if not self._security.auth_on:
                raise EtcdError("flags", code=grpc.StatusCode.FAILED_PRECONDITION, message=_FLAGS)
            return rpc_pb2.AuthEnableResponse(header=self._header())  # it is on already

        return await self._call(context, handle)

    async def AuthDisable(  # noqa: N802
        self, request: rpc_pb2.AuthDisableRequest, context: Context
    ) -> rpc_pb2.AuthDisableResponse:
        async def handle() -> rpc_pb2.AuthDisableResponse:
            raise EtcdError("flags", code=grpc.StatusCode.FAILED_PRECONDITION, message=_FLAGS)

        return await self._call(context, handle)

    # ------------------------------------------------------------------ users (superusers only)

    async def UserAdd(  # noqa: N802
        self, request: rpc_pb2.AuthUserAddRequest, context: Context
    ) -> rpc_pb2.AuthUserAddResponse:
        async def handle() -> rpc_pb2.AuthUserAddResponse:
            root = self._root()
            name = _user_name(request.name)
            if request.options.no_password and not request.password:
                record = NO_PASSWORD
            else:
                record = await self._hash(_password(request.password, request.hashedPassword))
            if not await root.add_user(name, record):
                raise EtcdError("user_exists")
            log.info("etcd user %r added", name)
            return rpc_pb2.AuthUserAddResponse(header=self._header())

        return await self._call(context, handle)

    async def UserGet(  # noqa: N802
        self, request: rpc_pb2.AuthUserGetRequest, context: Context
    ) -> rpc_pb2.AuthUserGetResponse:
        async def handle() -> rpc_pb2.AuthUserGetResponse:
            name = _user_name(request.name)
            if self._root().user(name) is None:
                raise EtcdError("user_not_found")
            # A user's role is its name.
            return rpc_pb2.AuthUserGetResponse(header=self._header(), roles=[name])

        return await self._call(context, handle)

    async def UserList(  # noqa: N802
        self, request: rpc_pb2.AuthUserListRequest, context: Context
    ) -> rpc_pb2.AuthUserListResponse:
        async def handle() -> rpc_pb2.AuthUserListResponse:
            return rpc_pb2.AuthUserListResponse(header=self._header(), users=self._root().users())

        return await self._call(context, handle)

    async def UserDelete(  # noqa: N802
        self, request: rpc_pb2.AuthUserDeleteRequest, context: Context
    ) -> rpc_pb2.AuthUserDeleteResponse:
        async def handle() -> rpc_pb2.AuthUserDeleteResponse:
            name = _user_name(request.name)
            if not await self._root().delete_user(name):
                raise EtcdError("user_not_found")
            log.info("etcd user %r deleted", name)
            return rpc_pb2.AuthUserDeleteResponse(header=self._header())

        return await self._call(context, handle)

    async def UserChangePassword(  # noqa: N802
        self, request: rpc_pb2.AuthUserChangePasswordRequest, context: Context
    ) -> rpc_pb2.AuthUserChangePasswordResponse:
        async def handle() -> rpc_pb2.AuthUserChangePasswordResponse:
            root = self._root()
            name = _user_name(request.name)
            if root.user(name) is None:
                raise EtcdError("user_not_found")
            record = await self._hash(_password(request.password, request.hashedPassword))
            if not await root.set_user_password(name, record):
                raise EtcdError("user_not_found")
            log.info("etcd user %r: password changed", name)
            return rpc_pb2.AuthUserChangePasswordResponse(header=self._header())

        return await self._call(context, handle)

    # ------------------------------------------------------------------ etcd roles: not built

    async def _no_roles(self, context: Context) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _NO_ROLES)

    async def UserGrantRole(self, request: Any, context: Context) -> Any:  # noqa: N802
        return await self._no_roles(context)

    async def UserRevokeRole(self, request: Any, context: Context) -> Any:  # noqa: N802
        return await self._no_roles(context)

    async def RoleAdd(self, request: Any, context: Context) -> Any:  # noqa: N802
        return await self._no_roles(context)

    async def RoleGet(self, request: Any, context: Context) -> Any:  # noqa: N802
        return await self._no_roles(context)

    async def RoleList(self, request: Any, context: Context) -> Any:  # noqa: N802
        return await self._no_roles(context)

    async def RoleDelete(self, request: Any, context: Context) -> Any:  # noqa: N802
        return await self._no_roles(context)

    async def RoleGrantPermission(self, request: Any, context: Context) -> Any:  # noqa: N802
        return await self._no_roles(context)

    async def RoleRevokePermission(self, request: Any, context: Context) -> Any:  # noqa: N802
        return await self._no_roles(context)

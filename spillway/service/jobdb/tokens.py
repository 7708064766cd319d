"""Tenants' bearer tokens: several per tenant, each with an expiry and its last use.

Rotation without downtime: ``spillway tenant token NAME --keep-old`` issues the next token
while the current one still works; once every client has it, ``spillway tenant
revoke-token NAME --old`` revokes the others. Tokens are 256 random bits stored as SHA-256
digests; the clear token exists only in the command's output.
"""

from __future__ import annotations

import re
import secrets
import time
from datetime import datetime, timedelta, timezone

from sqlalchemy import select, update

from .errors import JobDBError
from .models import Tenant, Token
from .rows import hash_token, now, tenant_dict

#: a token's last use is written at most this often (seconds), not once per request
TOUCH_INTERVAL_S = 60.0

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$", re.IGNORECASE)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def new_token() -> str:
    return "spw_" + secrets.token_urlsafe(32)


def utc(t: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; they were stored as UTC."""
    if t is not None and t.tzinfo is None:
        return t.replace(tzinfo=timezone.utc)
    return t


def parse_expiry(*, expires_in: str | None = None, expires_at: str | None = None,
                 now: datetime | None = None) -> datetime | None:
    """An expiry from a duration (``30d``, ``12h``, ``90m``, ``2w``) or an ISO date or time
    (``2027-01-31``: its start in UTC; a time without zone is UTC). JobDBError with one
    line naming the value where it is not one, or is not in the future."""

    now = now or datetime.now(timezone.utc)
    if expires_in is not None and expires_at is not None:
        raise JobDBError("expires-in and expires-at: give one of them")
    if expires_in is not None:
        m = _DURATION.match(expires_in)
        if not m:
            raise JobDBError(f"expires-in: {expires_in!r} is not a duration such as 30d, 12h, 90m or 2w")
        seconds = float(m.group(1)) * _UNIT_S[m.group(2).lower()]
        if seconds <= 0 or seconds > 100 * 365 * 86400:
            raise JobDBError(f"expires-in: {expires_in!r} must be more than 0 and at most 100 years")
        return now + timedelta(seconds=seconds)
    if expires_at is not None:
        try:
            t = datetime.fromisoformat(expires_at.strip())
        except ValueError:
            raise JobDBError(f"expires-at: {expires_at!r} is not an ISO date or time "
                             "(2027-01-31 or 2027-01-31T12:00:00+00:00)") from None
        t = utc(t)
        if t <= now:
            raise JobDBError(f"expires-at: {t.isoformat()} is not in the future")
        return t
    return None


#: the one line of a token that is not a live one (unknown, revoked, or its tenant revoked)
INVALID = "invalid or revoked token"


def expired_why(expires: datetime, tenant_name: str) -> str:
    """The one line of a token that expired at ``expires``."""
    return (f"token expired at {expires.isoformat(timespec='seconds')}; "
            f"ask the service's owner for a new one (spillway tenant token {tenant_name})")


def token_dict(t: Token) -> dict:
    iso = (lambda v: None if v is None else utc(v).isoformat())
    return {"id": t.id, "created": iso(t.created), "expires": iso(t.expires), "revoked": iso(t.revoked),
            "last_used": iso(t.last_used)}


class TokensMixin:
    """The token methods of :class:`~spillway.service.jobdb.JobDB`."""

    def _tenant_named(self, s, name: str) -> Tenant:

        t = s.scalar(select(Tenant).where(Tenant.name == name))
        if t is None:
            raise JobDBError(f"name: no tenant {name!r}")
        return t

    def authenticate(self, token: str) -> tuple[dict | None, str | None]:
        """(tenant, None) for a valid token; (None, why) otherwise, ``why`` one line. One
        query: for the command line and tests; the API answers from its copy of
        :meth:`live_tokens` (:class:`~spillway.service.api.auth.KnownTokens`)."""

        with self._session() as s:
            row = s.execute(select(Token, Tenant).join(Tenant, Token.tenant_id == Tenant.id)
                            .where(Token.token_hash == hash_token(token))).first()
            if row is None:
                return None, INVALID
            tok, tenant = row
            if tenant.revoked or tok.revoked is not None:
                return None, INVALID
            expires = utc(tok.expires)
            if expires is not None and expires <= now():
                return None, expired_why(expires, tenant.name)
            return tenant_dict(tenant) | {"token_id": tok.id, "token_expires": expires}, None

    def live_tokens(self) -> list[tuple[str, datetime | None, dict]]:
        """Every token that is neither revoked nor its tenant's revoked, expired ones too
        (so that one is told when it expired): (digest, expiry, what :meth:`authenticate`
        answers for it), in one query. What the API resolves tokens from, read again every
        second (:class:`~spillway.service.api.auth.KnownTokens`), on a connection of its own
        (:meth:`_tokens_engine`), so that it never waits behind the requests' pool."""

        tenant_columns = [c for c in Tenant.__table__.columns if c.name != "token_hash"]
        q = (select(Token.token_hash.label("digest"), Token.id.label("token_id"),
                    Token.expires.label("token_expires"), *tenant_columns)
             .join(Tenant, Token.tenant_id == Tenant.id)
             .where(Token.revoked.is_(None), Tenant.revoked.is_(False)))
        out = []
        tenants: dict[int, dict] = {}
        with self._tokens_engine().connect() as conn:
            for row in conn.execute(q):
                tenant = tenants.get(row.id)
                if tenant is None:
                    tenant = tenants[row.id] = tenant_dict(row)
                expires = utc(row.token_expires)
                out.append((row.digest, expires, tenant | {"token_id": row.token_id, "token_expires": expires}))
        return out

    def live_token_digests(self) -> list[str]:
        """The digests of every token that authenticates now (its tenant's and its own
        revocation, and its expiry, as :meth:`authenticate` checks them)."""

        t_now = now()
        return [digest for digest, expires, _ in self.live_tokens() if expires is None or expires > t_now]

    def touch_token(self, token_id: int):
        """Record a use of the token, at most once per :data:`TOUCH_INTERVAL_S`."""

        last = self._touched.get(token_id)
        mono = time.monotonic()
        if last is not None and mono - last < TOUCH_INTERVAL_S:
            return
        self._touched[token_id] = mono
        # on the token reader's own connection: the API records uses from its reader thread
        # (:class:`~spillway.service.api.auth.KnownTokens`), which must not wait behind the
        # requests' pool
        with self._write_lock, self._tokens_engine().begin() as conn:
            conn.execute(update(Token).where(Token.id == token_id).values(last_used=now()))

    def issue_token(self, name: str, *, expires: datetime | None = None, keep_old: bool = False) -> tuple[dict, str]:
        """A new token for tenant ``name``; its other tokens are revoked in the same
        transaction unless ``keep_old``."""

        token = new_token()
        with self._session() as s:
            tenant = self._tenant_named(s, name)
            if not keep_old:
                s.execute(update(Token).where(Token.tenant_id == tenant.id, Token.revoked.is_(None))
                          .values(revoked=now()))
            tok = Token(tenant_id=tenant.id, token_hash=hash_token(token), created=now(), expires=expires)
            s.add(tok)
            s.commit()
            return token_dict(tok), token

    def revoke_token(self, name: str, *, token_id: int | None = None, old: bool = False) -> list[int]:
        """Revoke one token of ``name`` (by id) or, with ``old``, every one but the newest;
        the ids revoked."""

        if (token_id is None) == (not old):
            raise JobDBError("token: give a token id or --old (every token but the newest)")
        with self._session() as s:
            tenant = self._tenant_named(s, name)
            live = s.scalars(select(Token).where(Token.tenant_id == tenant.id, Token.revoked.is_(None))
                             .order_by(Token.id)).all()
            if token_id is not None:
                chosen = [t for t in live if t.id == token_id]
                if not chosen:
                    ids = ", ".join(str(t.id) for t in live) or "none"
                    raise JobDBError(f"token: {name} has no valid token {token_id} (valid: {ids})")
            else:
                chosen = live[:-1]
            for t in chosen:
                t.revoked = now()
                if t.token_hash == tenant.token_hash:
                    # the schema-1 column must not authenticate a revoked token either
                    tenant.token_hash = hash_token(new_token())
            s.commit()
            return [t.id for t in chosen]

    def tokens(self, name: str) -> list[dict]:
        with self._session() as s:
            tenant = self._tenant_named(s, name)
            return [token_dict(t) for t in s.scalars(select(Token).where(Token.tenant_id == tenant.id)
                                                      .order_by(Token.id))]

    def _token_summaries(self, s) -> dict[int, dict]:
        """Per tenant: valid tokens, the soonest expiry among them, the last use of any."""

        out: dict[int, dict] = {}
        t_now = now()
        for tok in s.scalars(select(Token)):
            d = out.setdefault(tok.tenant_id, {"tokens": 0, "expires": None, "last_used": None})
            expires, used = utc(tok.expires), utc(tok.last_used)
            if used is not None and (d["last_used"] is None or used > d["last_used"]):
                d["last_used"] = used
            if tok.revoked is None and (expires is None or expires > t_now):
                d["tokens"] += 1
                if expires is not None and (d["expires"] is None or expires < d["expires"]):
                    d["expires"] = expires
        for d in out.values():
            d["expires"] = d["expires"] and d["expires"].isoformat()
            d["last_used"] = d["last_used"] and d["last_used"].isoformat()
        return out
